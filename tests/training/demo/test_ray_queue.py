"""The Ray half of ``make demo`` (training/demo/ray_queue.py): its specs pass ``ragpool submit`` and fit the
local Ray node they run on (no Ray started here; tests/training/ray/test_queue_ray.py runs them for real)."""

from __future__ import annotations

import pytest

from training.config.ray_executor import RAY_STAGES
from training.config.run import load_run_config
from training.demo import ray_queue
from training.demo.direct import demo_spec
from contract.ray_pools import POOLS_ENV
from training.ray.tune import TRIAL_DRIVER_CPUS, check_space, concurrency, milestone_every
from training.scheduler.spec import SpecError, parse_spec


@pytest.fixture
def pools(monkeypatch):
    monkeypatch.setenv(POOLS_ENV, f"{ray_queue.POOL}=0")


def _config(raw, root):
    spec = parse_spec(raw, shared_root=str(root))
    return spec, load_run_config(spec.to_training_config(str(root)))


def _local_node() -> list[dict]:
    """What ray.nodes() reports for the demo's Ray head."""
    from contract.names import POOL_LABEL

    return [{"Alive": True, "Labels": {POOL_LABEL: ray_queue.POOL}, "Resources": {"CPU": float(ray_queue.RAY_CPUS)}}]


def test_the_ray_run_is_the_demo_run_on_the_local_pool(tmp_path, pools) -> None:
    spec, cfg = _config(ray_queue.ray_demo_spec(tmp_path), tmp_path)
    _, torchrun_cfg = _config(demo_spec("demo", 2, tmp_path), tmp_path)
    assert spec.executor == "ray" and cfg.stages == torchrun_cfg.stages
    assert cfg.data == torchrun_cfg.data and cfg.seed == torchrun_cfg.seed
    for stage in RAY_STAGES:
        res = cfg.ray.stage(stage)
        # Every stage on the pool the local node carries, and never more than it has: no stage waits forever.
        assert res.pool == ray_queue.POOL, stage
        assert res.workers * res.cpus <= ray_queue.RAY_CPUS and res.gpus == 0, stage
    assert cfg.ray.retriever.workers == 2 and cfg.ray.generator.workers == 2  # DDP under Ray Train


def test_the_tune_search_runs_two_trials_at_once_on_the_local_node(tmp_path, pools) -> None:
    _, cfg = _config(ray_queue.tune_demo_spec(tmp_path), tmp_path)
    check_space(cfg)
    assert cfg.ray.tune.num_samples >= 4 and cfg.ray.tune.rungs == 2
    assert concurrency(cfg, _local_node()) == 2
    res = cfg.ray.retriever
    assert 2 * (res.workers * res.cpus + TRIAL_DRIVER_CPUS) <= ray_queue.RAY_CPUS
    # ASHA has a rung before the last step to stop trials at, and warm-up ends within the trial.
    assert milestone_every(cfg) < cfg.retriever.max_steps
    assert cfg.retriever.optim.warmup_steps <= cfg.retriever.max_steps


def test_the_local_head_turns_off_only_ray_trains_preemption_watcher() -> None:
    """One local node is never preempted; the variable is the one Ray Train reads."""
    pytest.importorskip("ray.train")
    from ray.train.v2._internal.constants import ENABLE_PREEMPTION_WATCHER_ENV_VAR

    from training.localdev.ray_head import PREEMPTION_WATCHER_ENV, LocalRayHead

    assert PREEMPTION_WATCHER_ENV == ENABLE_PREEMPTION_WATCHER_ENV_VAR
    env = LocalRayHead().process_env()
    assert env[PREEMPTION_WATCHER_ENV] == "0"


def test_the_local_head_names_its_dashboard_in_the_variable_rays_state_api_reads() -> None:
    """A State API client with no address inside the head asks this dashboard, not another Ray on the machine."""
    pytest.importorskip("ray")
    from ray._private import ray_constants

    from training.localdev.ray_head import API_SERVER_ENV

    assert API_SERVER_ENV == ray_constants.RAY_API_SERVER_ADDRESS_ENVIRONMENT_VARIABLE


def test_without_the_local_pool_declared_submit_refuses_the_ray_run(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(POOLS_ENV, raising=False)
    with pytest.raises(SpecError, match=f"pool '{ray_queue.POOL}' does not exist"):
        parse_spec(ray_queue.ray_demo_spec(tmp_path), shared_root=str(tmp_path))
