"""training.components.metrics: every rank's endpoint serves the contract's names with run_id/stage/rank labels."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from training.components.metrics import METRIC_NAMES, TrainMetrics
from contract.ports import free_port


def _scrape(port: int) -> dict[str, list]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_endpoint_serves_contract_names_per_rank() -> None:
    base = free_port()
    m = TrainMetrics()
    assert m.serve(base, "127.0.0.1", local_rank=0) == base
    stage = m.for_stage("run1", "retriever", rank=0)
    stage.step(loss=1.5, duration_s=0.5, samples=8, tokens=400)
    stage.step(loss=float("nan"), duration_s=0.25, samples=8, tokens=400)
    stage.checkpoint(2.0)
    got = _scrape(base)
    expected = {n for n in METRIC_NAMES if n != "ragpool_gpu_memory_allocated_bytes"}  # CUDA only
    present = {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for name in got}
    assert expected <= present
    (step,) = got["ragpool_train_step_total"]
    assert step.value == 2 and step.labels == {"run_id": "run1", "stage": "retriever", "rank": "0"}
    assert got["ragpool_train_samples_per_second"][0].value == 32.0
    assert got["ragpool_train_tokens_per_second"][0].value == 1600.0
    loss = got["ragpool_train_loss"][0].value
    assert loss != loss  # NaN is exported as NaN, not dropped
    assert got["ragpool_checkpoint_duration_seconds_count"][0].value == 1
    assert got["ragpool_checkpoint_last_success_timestamp_seconds"][0].value > 1.7e9


def test_port_zero_disables_and_local_rank_offsets() -> None:
    assert TrainMetrics().serve(0) is None
    base = free_port()
    m = TrainMetrics()
    while True:  # need base and base+1 free
        try:
            port = m.serve(base - 1, "127.0.0.1", local_rank=1)
            break
        except OSError:
            base = free_port()
    assert port == base
    m.for_stage("r", "generator", 1).step(1.0, 1.0, 1, 1)
    assert _scrape(base)["ragpool_train_step_total"][0].labels["rank"] == "1"


def test_finished_stage_drops_its_series_so_it_cannot_look_stalled() -> None:
    from prometheus_client import generate_latest

    from training.components.metrics import TrainMetrics

    m = TrainMetrics()
    retriever = m.for_stage("run-1", "retriever", 0)
    retriever.step(loss=0.5, duration_s=0.1, samples=4, tokens=40)
    retriever.checkpoint(0.2)
    generator = m.for_stage("run-1", "generator", 0)
    generator.step(loss=1.5, duration_s=0.1, samples=4, tokens=40)
    retriever.close()
    text = generate_latest(m.registry).decode()
    assert 'stage="retriever"' not in text
    assert 'ragpool_train_last_step_timestamp_seconds{rank="0",run_id="run-1",stage="generator"}' in text


def test_world_size_and_the_fewest_ranks_the_stage_may_train_on() -> None:
    from prometheus_client import generate_latest

    m = TrainMetrics()
    stage = m.for_stage("r", "generator", 0)
    stage.world(6, 4)  # an elastic run of nodes {min: 2, max: 4}, 2 ranks per node, at 3 nodes

    def value(name: str) -> float:
        line = next(t for t in generate_latest(m.registry).decode().splitlines() if t.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert (value("ragpool_train_world_size"), value("ragpool_train_min_world_size")) == (6.0, 4.0)
    stage.world(8)  # a fixed-size run: its world is its least
    assert (value("ragpool_train_world_size"), value("ragpool_train_min_world_size")) == (8.0, 8.0)
