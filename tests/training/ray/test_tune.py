"""Ray Tune's trials at once (training/ray/tune.py ``concurrency``), without starting Ray: from the
namespace's declared pools (``RAGPOOL_RAY_POOLS`` with each pool's most nodes) when it declares them,
so an idle cluster autoscaling from zero starts every trial the pool will hold at once; from the live
nodes otherwise."""

from __future__ import annotations

import pytest

from training.config.run import load_run_config
from training.config.sections import ConfigError
from contract.names import POOL_LABEL
from contract.ray_pools import POOLS_ENV, format_pools, parse_pool_nodes, parse_pools
from training.ray.tune import TRIAL_DRIVER_CPUS, concurrency


def _cfg(pool: str = "gpu-spot", gpus: int = 1, workers: int = 2, cpus: int = 1, max_concurrent: int = 0):
    return load_run_config({"run_id": "t", "stages": ["retriever"], "ray": {
        "retriever": {"pool": pool, "gpus": gpus, "workers": workers, "cpus": cpus},
        "tune": {"max_concurrent": max_concurrent}}})


def _node(pool: str, gpus: int = 0, cpus: int = 8) -> dict:
    return {"Alive": True, "Labels": {POOL_LABEL: pool}, "Resources": {"CPU": float(cpus), "GPU": float(gpus)}}


IDLE: list[dict] = []  # autoscaling from zero: no worker node alive (the head is in no pool)


def test_an_idle_cluster_runs_as_many_trials_as_the_declared_pool_holds():
    # gpu-spot: 4 nodes of 4 GPUs; a trial is 2 workers of 1 GPU: 4 x 4 // 2 = 8 trials, not 1.
    assert concurrency(_cfg(), IDLE, "gpu-spot=4x4,gpu-ondemand=8x1") == 8
    # 3 GPUs a worker: one per 4-GPU node (the 4th GPU idles), 4 workers // 2 per trial = 2.
    assert concurrency(_cfg(gpus=3), IDLE, "gpu-spot=4x4") == 2
    # Declared, the live nodes do not matter: one alive node would otherwise say 2.
    assert concurrency(_cfg(), [_node("gpu-spot", gpus=4)], "gpu-spot=4x4") == 8
    # A trial bigger than the pool still gets one slot (plan() refuses what can never fit).
    assert concurrency(_cfg(workers=32), IDLE, "gpu-spot=4x4") == 1


def test_any_node_sums_every_declared_pool():
    assert concurrency(_cfg(pool=""), IDLE, "gpu-spot=4x4,gpu-ondemand=8x2,cpu=0x3") == (16 + 16) // 2
    # One pool without its node count: the sum is unknown, so the live nodes decide.
    live = [_node("gpu-spot", gpus=4), _node("gpu-ondemand", gpus=8)]
    assert concurrency(_cfg(pool=""), live, "gpu-spot=4x4,gpu-ondemand=8") == (4 + 8) // 2


def test_without_a_declared_node_count_the_live_nodes_decide():
    live = [_node("gpu-spot", gpus=4), _node("gpu-spot", gpus=4), _node("other", gpus=8)]
    assert concurrency(_cfg(), live, "gpu-spot=4") == 4  # 8 live GPUs of the pool // 2 per trial
    assert concurrency(_cfg(), live, "") == 4  # nothing declared
    assert concurrency(_cfg(), IDLE, "gpu-spot=4") == 1  # idle, and no size declared: one at a time
    # Another pool's node count says nothing about this one.
    assert concurrency(_cfg(), live, "gpu-spot=4,other=8x9") == 4


def test_cpu_trials_count_live_cpus_the_declaration_has_none():
    live = [_node("cpu", cpus=9)]
    per_trial = 2 * 2 + TRIAL_DRIVER_CPUS
    assert concurrency(_cfg(pool="cpu", gpus=0, cpus=2), live, "cpu=0x10") == int(9 // per_trial) == 2


def test_max_concurrent_wins_and_the_environment_is_the_default(monkeypatch):
    assert concurrency(_cfg(max_concurrent=3), IDLE, "gpu-spot=4x4") == 3
    monkeypatch.setenv(POOLS_ENV, "gpu-spot=4x4")
    assert concurrency(_cfg(), IDLE) == 8
    monkeypatch.setenv(POOLS_ENV, "gpu-spot=4xfour")
    with pytest.raises(ConfigError, match="gpu-spot=4xfour") as bad:
        concurrency(_cfg(), IDLE)
    assert bad.value.key == POOLS_ENV


def test_pool_sizes_round_trip_and_old_items_still_parse():
    text = format_pools({"b": 8, "a": 1}, {"b": 2})
    assert text == "a=1,b=8x2"
    assert parse_pools(text) == {"a": 1, "b": 8} and parse_pool_nodes(text) == {"b": 2}
    assert parse_pools("gpu-spot=1,gpu-ondemand=8") == {"gpu-spot": 1, "gpu-ondemand": 8}
    assert parse_pool_nodes("gpu-spot=1,gpu-ondemand=8") == {}


def test_a_milestone_scores_over_the_positives_and_a_sample_of_a_large_corpus(tmp_path) -> None:
    from training.components.corpus import prepare
    from training.components.data import QAExample
    from training.ray.tune import candidates

    src = tmp_path / "c.jsonl"
    src.write_text("".join(f'{{"id": "p{i}", "text": "t{i}"}}\n' for i in range(1000)))
    corpus = prepare(src, tmp_path / "prepared")
    examples = [QAExample("q", "a", ("p7",)), QAExample("q", "a", ("p993", "p500"))]
    assert candidates(corpus, examples, 1000, seed=0) == list(range(1000))  # small: the whole corpus, in order
    rows = candidates(corpus, examples, 50, seed=0)
    assert len(rows) == 50 and {7, 993, 500} <= set(rows) and rows == sorted(rows)
    assert rows == candidates(corpus, examples, 50, seed=0) != candidates(corpus, examples, 50, seed=1)


def test_a_queued_search_runs_tune_as_its_ray_job_and_its_best_config_runs_the_driver(tmp_path) -> None:
    """``ragpool tune`` through the run API queues a run with ``ray.tune.search``: its Ray job runs the search
    instead of the driver (``then_run``: with --start), and the best config it writes has the search off (the
    driver runs it, never searches again)."""
    import yaml

    from training.ray import job, tune

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"run_id": "t", "shared_root": str(tmp_path), "stages": ["retriever"],
                                      "ray": {"tune": {"search": "then_run"}}}))
    assert job.driver_entrypoint(str(config), job.search_of(str(config))) == \
        f"python -m training.ray.tune --config {config} --start"
    assert job.search_of(str(tmp_path / "missing.yaml")) == "off"  # the driver reports a missing config
    cfg = load_run_config(str(config))
    rows = [{"trial": "a", "lr": 1e-4, "temperature": 0.05, "global_batch_size": 8, "mrr": 0.5, "steps": 2,
             "state": "complete"}]
    paths = tune.write_results(cfg, rows)
    assert load_run_config(str(paths["best"])).ray.tune.search == "off"
    assert tune.printed(paths["table"].read_text(), {"best": "x"}).splitlines()[-1] == '{"best": "x"}'
    with pytest.raises(ConfigError, match="search"):
        load_run_config({"run_id": "t", "ray": {"tune": {"search": "sometimes"}}})
