"""Ray runs from zero: on an idle autoscaling Ray cluster (a 0-CPU head, worker node types at 0 nodes),
a ray run's placement groups make Ray's autoscaler (v2) add a node of the right pool, the run survives a
killed Ray Train worker group and completes with the same outputs as under torchrun, and the cluster scales
back to zero; a pool at its max waits,
then fails naming the stage, the pool and the resources. The namespace's declared pools reach the
driver's stage tasks, which plan against them.

One cluster for the module (:mod:`training.demo.ray_autoscaling`: Ray's fake multi-node provider, the
node types carrying the pool label and logical GPUs, ``min_workers: 0``, idle nodes removed after 6 s).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.support import tiny_run
from tests.support.training import write_run
from tests.training.ray.conftest import needs_ray, ray_env

pytestmark = [pytest.mark.slow, pytest.mark.ray]
needs_ray()

POOL_A = "pool-a"
"""The run's pool: nodes of 2 CPUs and 1 GPU, at most 1."""
POOL_B = "pool-b"
"""A pool at its max once one node of it is up (max_workers 1)."""
SCALE_S = 120
"""Bound on a scale-up (seconds; ~3 s measured) and on the scale-down (idle timeout 6 s)."""
RUN_S = 600
"""Bound on the from-zero run (the four stages with tiny models and one worker-group restart: about two minutes
here)."""
STAGES = ("retriever", "index", "generator", "evaluate")
"""The from-zero run's stages: the whole tiny pipeline."""


@pytest.fixture
def shared(tmp_path) -> Path:
    """A shared root with the tiny run's data (each test its own)."""
    return tiny_run.write_data(tmp_path)


@pytest.fixture(scope="module")
def cluster():
    from training.demo.ray_autoscaling import LocalAutoscalingCluster, PoolNodeType, connected

    ray_env()
    node_types = [PoolNodeType(POOL_A, cpus=2, gpus=1, max_workers=1),
                  PoolNodeType(POOL_B, cpus=1, gpus=1, max_workers=1)]
    with connected(LocalAutoscalingCluster(node_types=node_types, idle_timeout_s=6)) as c:
        yield c


@pytest.fixture
def declared(monkeypatch, cluster) -> None:
    """``RAGPOOL_RAY_POOLS`` as the worker template sets it: every pool of the cluster, GPUs per node."""
    from contract.ray_pools import POOLS_ENV, format_pools

    monkeypatch.setenv(POOLS_ENV, format_pools({t.pool: t.gpus for t in cluster.node_types}))


class PoolWatcher:
    """Samples the alive worker nodes by pool every 0.25 s: the most nodes of each pool seen at once."""

    def __init__(self, cluster) -> None:
        self.cluster, self.seen = cluster, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pool, n in self.cluster.pools_up().items():
                self.seen[pool] = max(self.seen.get(pool, 0), n)
            self._stop.wait(0.25)

    def __enter__(self) -> PoolWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_ray_run_on_an_idle_cluster_scales_up_its_pool_survives_a_killed_worker_and_scales_down(
        cluster, declared, shared, tiny_encoder_dir, finished_run, monkeypatch) -> None:
    """The whole tiny pipeline under the Ray executor, from zero: a node of the run's pool comes up for it,
    the retriever's Ray Train worker group loses its ranks to SIGKILL right after step 2 (checkpointed) and
    Ray Train restarts it from that checkpoint (``ray.max_failures: 1``), and every stage ends with the
    torchrun path's outputs: the same run layout, stage markers, fingerprints and report. Then the
    cluster goes back to zero."""
    import ray
    from ray.exceptions import GetTimeoutError

    from tests.support import faults
    from training.components.loop import HOOKS_ENV
    from training.config.run import load_run_config
    from training.ray import driver

    cluster.wait_idle(SCALE_S)
    sections = tiny_run.sections(tiny_encoder_dir, max_failures=1)
    on_a = {"pool": POOL_A, "workers": 2, "cpus": 1}
    sections["ray"] = {**sections["ray"], "placement_timeout_s": SCALE_S,
                       **{stage: on_a for stage in ("prepare", *STAGES)}}
    ray_cfg = write_run(shared, "from-zero", **sections)
    # Every rank of the retriever's worker group is SIGKILLed right after step 2 (its checkpoint written first).
    for name, value in {faults.RESUME_FAULT_ENV: "2", faults.FAULT_STAGE_ENV: "retriever",
                        HOOKS_ENV: faults.MODULE}.items():
        monkeypatch.setenv(name, value)
    with PoolWatcher(cluster) as watch:
        try:
            summaries = ray.get(driver.submit(load_run_config(ray_cfg)), timeout=RUN_S)
        except GetTimeoutError:
            pytest.fail(f"waited {RUN_S}s for the ray run to complete; worker nodes seen by pool: {watch.seen}")
    # A node of the run's pool came up for it, and nothing of another pool; its pool's max held.
    assert watch.seen == {POOL_A: 1}, watch.seen
    for stage in ("prepare", *STAGES):
        assert f"on pool '{POOL_A}'" in summaries[stage]["placement"], summaries[stage]
    # The killed worker group was replaced and resumed from its checkpoint; the other training stage never failed.
    r_dir, t_dir = shared / "runs" / "from-zero", finished_run[0] / "runs" / tiny_run.RUN_ID
    retriever = json.loads((r_dir / "retriever" / "_COMPLETE").read_text())
    assert retriever["steps"] == tiny_run.RETRIEVER_STEPS and retriever["resumed_from"] == 2, retriever
    assert json.loads((r_dir / "generator" / "_COMPLETE").read_text())["resumed_from"] is None
    # The same outputs as the torchrun path: the session's finished tiny run (same data, seed and sections but
    # ``ray``, which no fingerprint covers), so either executor resumes the other's run.
    assert tiny_run.layout(r_dir) == tiny_run.layout(t_dir)
    for stage in STAGES:
        r_marker = json.loads((r_dir / stage / "_COMPLETE").read_text())
        t_marker = json.loads((t_dir / stage / "_COMPLETE").read_text())
        assert set(r_marker) == set(t_marker), stage
        assert r_marker["config_fingerprint"] == t_marker["config_fingerprint"], stage
    assert json.loads((r_dir / "index" / "_COMPLETE").read_text())["passages"] == \
        json.loads((t_dir / "index" / "_COMPLETE").read_text())["passages"]
    t_report = json.loads((t_dir / "evaluate" / "report.json").read_text())
    assert tiny_run.key_paths(json.loads((r_dir / "evaluate" / "report.json").read_text())) == \
        tiny_run.key_paths(t_report)
    # Idle again: the autoscaler removes the node (idle timeout 6 s).
    cluster.wait_idle(SCALE_S)


def test_a_run_for_a_pool_at_its_max_waits_then_fails_naming_stage_pool_and_resources(
        cluster, declared, shared, tiny_encoder_dir, capsys) -> None:
    from training.config.ray_executor import RayStageConfig
    from contract.exit_codes import UNAVAILABLE
    from training.ray import driver
    from training.ray.placement import plan, reserved

    cluster.wait_idle(SCALE_S)
    # Another run holds the one node pool-b may have (max_workers 1).
    with reserved(plan("index", RayStageConfig(pool=POOL_B, cpus=1), []), SCALE_S, "other-run-index"):
        assert cluster.pools_up() == {POOL_B: 1}
        sections = tiny_run.sections(tiny_encoder_dir)
        sections["ray"] = {**sections["ray"], "prepare": {"pool": POOL_B, "workers": 1, "cpus": 1}}
        cfg = write_run(shared, "at-max", stages=["index"], **sections)
        t0 = time.monotonic()
        code = driver.main(["--config", str(cfg), "--ray.placement_timeout_s=5"])
        waited = time.monotonic() - t0
        assert cluster.pools_up() == {POOL_B: 1}  # the autoscaler kept to the node type's max
    err = capsys.readouterr().err
    assert code == UNAVAILABLE, err[-2000:]
    assert waited >= 5
    line = next(x for x in err.splitlines() if "failed: PlacementError" in x)
    assert f"stage prepare: waited 5s for 1 x {{CPU: 1}} (SPREAD) on pool '{POOL_B}'" in line, line
    assert "1 node(s) of it alive" in line and "maxReplicas" in line, line
    assert not (shared / "runs" / "at-max" / "index").exists()
    cluster.wait_idle(SCALE_S)


def test_the_bench_measures_an_idle_cluster_to_first_stage_running(cluster, declared, tmp_path) -> None:
    from bench import ray_from_zero

    seconds = ray_from_zero.first_stage_s(cluster, tmp_path, run_id="bench-from-zero", pool=POOL_A)
    # A node must be added first: more than the autoscaler's 1 s loop, far less than the bound.
    assert 1.0 < seconds < SCALE_S, seconds


def test_the_declaration_reaches_the_driver_and_its_stage_tasks(monkeypatch) -> None:
    """The Ray worker's RAGPOOL_RAY_POOLS goes into the Ray job's environment (python -m training.ray.job), and
    from the driver into its stage tasks' (which plan): else an idle cluster's run fails at once again."""
    import ray.job_submission

    from training.ray import driver, job
    from contract.ray_pools import POOLS_ENV

    sent = {}

    class Client:
        def __init__(self, address, headers=None) -> None:
            self.address = address

    def run_job(client, config, submission_id, stop, runtime_env=None) -> int:
        sent.update(runtime_env["env_vars"])
        return 0

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setattr(job, "run_job", run_job)
    monkeypatch.setattr(job.signal, "signal", lambda *_: None)  # not this test process's handlers
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(POOLS_ENV, "gpu-spot=1,gpu-ondemand=8")
    monkeypatch.setenv("RAGPOOL_RUN_ID", "r1")
    assert job.main(["--config", "/shared/runs/r1/run.yaml", "--address", "http://head:8265"]) == 0
    assert sent[POOLS_ENV] == "gpu-spot=1,gpu-ondemand=8" and sent["RAGPOOL_RUN_ID"] == "r1"
    assert driver._worker_env()[POOLS_ENV] == "gpu-spot=1,gpu-ondemand=8"
