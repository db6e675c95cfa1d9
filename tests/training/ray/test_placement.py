"""Stage placement on a simulated 2-node Ray cluster with two pools (a, b: 2 CPUs each).

Bundles land on their stage's pool and never elsewhere; two runs never share a bundle (a
second reservation of a full pool waits and then fails naming stage, pool and resources);
a request no node of the pool can ever hold fails at once. On an idle cluster (no worker node
alive) a declared pool is planned from ``RAGPOOL_RAY_POOLS`` (test_from_zero.py runs it on an
autoscaling cluster).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.training.ray.conftest import needs_ray, ray_env, ray_temp_dir
from training.config.ray_executor import RayStageConfig
from contract.names import POOL_LABEL
from training.ray.placement import PlacementError, bundle_nodes, plan, reserved, strategy_for

pytestmark = [pytest.mark.slow, pytest.mark.ray]
needs_ray()


def _node(pool: str | None, cpus: float, gpus: float = 0, alive: bool = True) -> dict:
    return {"NodeID": f"n-{pool}-{cpus}", "Alive": alive, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})},
            "Labels": {POOL_LABEL: pool} if pool else {}}


@pytest.mark.parametrize("stage, res, nodes, want", [
    ("retriever", RayStageConfig(pool="a", workers=2, cpus=1), [_node("a", 2)], "STRICT_PACK"),
    ("retriever", RayStageConfig(pool="a", workers=3, cpus=1), [_node("a", 2), _node("a", 2)], "PACK"),
    ("prepare", RayStageConfig(pool="a", workers=3, cpus=1), [_node("a", 2)], "SPREAD"),
    ("index", RayStageConfig(pool="", workers=2, cpus=1, strategy="STRICT_SPREAD"), [_node(None, 2)], "STRICT_SPREAD"),
])
def test_plan_strategy(stage, res, nodes, want) -> None:
    p = plan(stage, res, nodes)
    assert p.strategy == want
    assert p.placement_group_kwargs()["bundles"] == [{"CPU": 1.0}] * res.workers
    sel = p.placement_group_kwargs()["bundle_label_selector"]
    assert sel == ([{POOL_LABEL: res.pool}] * res.workers if res.pool else None)


def test_an_elastic_training_stage_is_packed_admitted_at_its_min_and_scaled_by_ray_train() -> None:
    """``workers: {min: 2, max: 3}``: PACK even when all fit one node (it spans and loses nodes), the admission
    waits for 2 bundles, Ray Train gets ``num_workers=(2, 3)`` and the resize interval."""
    p = plan("retriever", RayStageConfig(pool="a", workers=3, min_workers=2, cpus=1), [_node("a", 4)])
    assert (p.strategy, p.elastic, p.describe()) == ("PACK", True, "2-3 x {CPU: 1} (PACK) on pool 'a'")
    assert p.placement_group_kwargs()["bundles"] == [{"CPU": 1.0}] * 2
    kwargs = p.scaling_kwargs(7.0)
    assert (kwargs["num_workers"], kwargs["elastic_resize_monitor_interval_s"]) == ((2, 3), 7.0)
    fixed = plan("retriever", RayStageConfig(pool="a", workers=3, cpus=1), [_node("a", 4)])
    assert fixed.strategy == "STRICT_PACK" and fixed.scaling_kwargs(7.0)["num_workers"] == 3
    assert "elastic_resize_monitor_interval_s" not in fixed.scaling_kwargs(7.0)


def test_plan_refuses_what_can_never_fit() -> None:
    nodes = [_node("a", 2), _node("b", 8, gpus=1), _node("c", 64, alive=False)]
    with pytest.raises(PlacementError, match=r"stage index: pool 'c' has no nodes .*pools: a, b"):
        plan("index", RayStageConfig(pool="c"), nodes)
    with pytest.raises(PlacementError, match=r"stage generator: one worker needs \{'CPU': 1.0, 'GPU': 2.0\}.*pool 'b'"):
        plan("generator", RayStageConfig(pool="b", gpus=2), nodes)
    with pytest.raises(PlacementError, match=r"stage retriever: one worker needs \{'CPU': 4.0\}"):
        plan("retriever", RayStageConfig(pool="a", cpus=4), nodes)
    assert plan("generator", RayStageConfig(pool="b", gpus=1), nodes).scaling_kwargs()["use_gpu"] is True


IDLE = [{"NodeID": "head", "Alive": True, "Resources": {"memory": 1e9}, "Labels": {}}]
"""An idle RayCluster: the head alone (num-cpus 0), every worker group at 0 replicas."""


def test_plan_on_an_idle_cluster_reads_the_declaration() -> None:
    declared = {"a": 1, "b": 8}
    one = plan("retriever", RayStageConfig(pool="b", workers=4, gpus=2), IDLE, declared)
    assert one.strategy == "STRICT_PACK"  # 4 x 2 GPUs fit one 8-GPU node of b
    assert one.placement_group_kwargs()["bundle_label_selector"] == [{POOL_LABEL: "b"}] * 4
    assert plan("generator", RayStageConfig(pool="a", workers=2, gpus=1), IDLE, declared).strategy == "PACK"
    # CPU-only bundles: the declaration has no CPU count, so no STRICT_PACK on a guess.
    assert plan("retriever", RayStageConfig(pool="a", workers=2, cpus=1), IDLE, declared).strategy == "PACK"
    # Task stages on "any node" wait for whatever node type the autoscaler picks.
    prep = plan("prepare", RayStageConfig(workers=3), IDLE, declared)
    assert (prep.strategy, prep.label_selector) == ("SPREAD", None)
    assert plan("evaluate", RayStageConfig(gpus=8), IDLE, declared).bundle == {"CPU": 1.0, "GPU": 8.0}


def test_plan_from_the_declaration_still_refuses_what_can_never_fit() -> None:
    declared = {"a": 1, "b": 8}
    with pytest.raises(PlacementError, match=r"stage generator: one worker needs \{'CPU': 1.0, 'GPU': 2.0\} but no "
                                             r"node of pool 'a' has that much \(largest: GPU 1 per node as declared\)"):
        plan("generator", RayStageConfig(pool="a", gpus=2), IDLE, declared)
    with pytest.raises(PlacementError, match=r"stage evaluate: .* no node of the cluster .*GPU 8 per node of any"):
        plan("evaluate", RayStageConfig(gpus=9), IDLE, declared)
    with pytest.raises(PlacementError, match=r"stage index: pool 'c' has no nodes in the Ray cluster \(pools: a, b\)"):
        plan("index", RayStageConfig(pool="c"), IDLE, declared)
    # A node of the pool is alive: its size is the worker group's, CPUs are checked against it at once.
    with pytest.raises(PlacementError, match=r"stage retriever: one worker needs \{'CPU': 4.0\}.*CPU 2, GPU 1"):
        plan("retriever", RayStageConfig(pool="a", cpus=4), [*IDLE, _node("a", 2, gpus=1)], declared)
    # Nothing declared: today's rule, the alive nodes (the head has no CPU).
    with pytest.raises(PlacementError, match=r"stage prepare: one worker needs \{'CPU': 1.0\} but no node of the "
                                             r"cluster"):
        plan("prepare", RayStageConfig(workers=3), IDLE, {})


def test_plan_reads_the_declaration_from_the_environment(monkeypatch) -> None:
    from training.config.sections import ConfigError
    from contract.ray_pools import POOLS_ENV

    monkeypatch.setenv(POOLS_ENV, "a=1")
    assert plan("index", RayStageConfig(pool="a"), IDLE).pool == "a"
    monkeypatch.setenv(POOLS_ENV, "a=one")
    with pytest.raises(ConfigError, match=POOLS_ENV):
        plan("index", RayStageConfig(pool="a"), IDLE)
    monkeypatch.delenv(POOLS_ENV)
    with pytest.raises(PlacementError, match="pool 'a' has no nodes"):
        plan("index", RayStageConfig(pool="a"), IDLE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray_env()
    import ray
    from ray.cluster_utils import Cluster

    temp = ray_temp_dir(tmp_path_factory)
    # Cluster records its address in the default Ray temp dir (/tmp/ray) whatever temp_dir says; on a
    # machine where no Ray ever ran there, that directory does not exist yet.
    os.makedirs(os.path.dirname(ray._private.utils.get_ray_address_file(None)), exist_ok=True)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": temp})
    nodes = {pool: c.add_node(num_cpus=2, labels={POOL_LABEL: pool}) for pool in ("a", "b")}
    ray.init(address=c.address)
    c.wait_for_nodes()
    yield {pool: n.node_id for pool, n in nodes.items()}
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def _labels_of_task_in(pg, index: int) -> dict:
    import ray

    @ray.remote(num_cpus=1)
    def where() -> dict:
        return dict(ray.get_runtime_context().get_node_labels())

    return ray.get(where.options(scheduling_strategy=strategy_for(pg, index)).remote())


def test_bundles_land_on_their_pool(cluster) -> None:
    import ray

    prep = plan("prepare", RayStageConfig(pool="a", workers=2, cpus=1), ray.nodes())
    train = plan("retriever", RayStageConfig(pool="b", workers=2, cpus=1), ray.nodes())
    assert (prep.strategy, train.strategy) == ("SPREAD", "STRICT_PACK")
    with reserved(prep, 30, "run1-prepare") as pg_a, reserved(train, 30, "run1-retriever") as pg_b:
        assert set(bundle_nodes(pg_a).values()) == {cluster["a"]}
        assert set(bundle_nodes(pg_b).values()) == {cluster["b"]}
        assert _labels_of_task_in(pg_a, 1)[POOL_LABEL] == "a"
        assert _labels_of_task_in(pg_b, 0)[POOL_LABEL] == "b"
    # Released when the stage ends: the whole pool is free again.
    with reserved(plan("retriever", RayStageConfig(pool="b", workers=2, cpus=1), ray.nodes()), 30) as pg:
        assert len(bundle_nodes(pg)) == 2


def test_two_runs_never_share_a_bundle_and_a_full_pool_fails_with_the_message(cluster) -> None:
    import ray

    stage = RayStageConfig(pool="a", workers=2, cpus=1)
    with reserved(plan("retriever", stage, ray.nodes()), 30, "run1-retriever"):
        # Pool b has room, yet run2's stage for pool a must not go there: it waits, then fails.
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as err:
            with reserved(plan("retriever", stage, ray.nodes()), 3, "run2-retriever"):
                pass
        assert time.monotonic() - t0 >= 3
        msg = str(err.value)
        assert "stage retriever" in msg and "pool 'a'" in msg and "2 x {CPU: 1}" in msg and "3s" in msg
        # Half of pool a for run2 does not fit either while run1 holds both CPUs.
        with pytest.raises(PlacementError):
            with reserved(plan("index", RayStageConfig(pool="a", workers=1, cpus=1), ray.nodes()), 1):
                pass
    with reserved(plan("retriever", stage, ray.nodes()), 30, "run2-retriever") as pg:
        assert set(bundle_nodes(pg).values()) == {cluster["a"]}
