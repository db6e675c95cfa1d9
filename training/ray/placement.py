"""Resource isolation for the Ray executor: one placement group per stage, on the stage's pool.

A pool is the set of Ray nodes labelled ``ragpool.io/pool=<pool>`` (the KubeRay worker group
of a GPU pool sets that label; a local cluster sets it with ``ray.init(labels=...)``). Each
stage reserves ``workers`` bundles of ``{CPU: cpus, GPU: gpus}`` with a ``bundle_label_selector``
naming its pool, so its work can only run there: Ray never places a bundle on a node whose
labels do not match, so a stage never lands on another pool. Bundles are exclusive to their
placement group, so two runs (or two stages) never share one. The reservation is released when
the stage ends (:func:`reserved` is a context manager).

A stage whose pool has no room waits up to ``ray.placement_timeout_s`` and then fails with
:class:`PlacementError` naming the stage, the pool and the resources it waited for. A request
that can never fit (unknown pool, more CPUs/GPUs per bundle than any node of the pool has)
fails at once.

From zero: a RayCluster's worker groups idle at 0 replicas, and its head has ``num-cpus: 0``, so
on an idle cluster no node of any pool is alive. What a pool can hold is then read from the
namespace's declaration (``RAGPOOL_RAY_POOLS``, :mod:`contract.ray_pools`: pool -> GPUs of one
of its Ray workers), not from the nodes that happen to be alive: a stage whose pool is declared
(or whose pool is empty, "any node", while pools are declared) is checked against it, and its
placement group is created even with no node of the pool alive. The pending group is the demand
Ray's autoscaler (v2) reads from the GCS to add a node of a type whose resources and labels
satisfy its bundles and ``bundle_label_selector`` (ray/autoscaler/v2/scheduler.py
``ResourceDemandScheduler._sched_gang_resource_requests``: pending placement groups, each bundle with its label
selector); :func:`reserved` waits up to ``ray.placement_timeout_s`` for it. A pool whose worker
group is at its maxReplicas gets no node, and the stage fails at the timeout naming the stage, the
pool, the resources and the nodes of the pool that were alive. The declaration carries GPUs only:
CPUs per bundle are checked against an alive node of the pool when there is one (every node of a
pool is its worker group's size), else left to the autoscaler and the timeout.

Strategies (``ray.<stage>.strategy``): ``auto`` is STRICT_PACK for training workers when all
bundles fit one node of the pool (DDP ranks then talk over loopback / NVLink), PACK when they
do not or when the stage is elastic (``workers: {min, max}``: it spans and loses nodes), and SPREAD
for the task stages (prepare, index, evaluate).

Ray Train creates its own placement group from a :class:`ray.train.ScalingConfig`; for the
training stages the driver first waits for a reservation of the same shape (so the timeout
and the error apply), hands it back, and gives Ray Train the same bundles, strategy and label
selector (:meth:`StagePlacement.scaling_kwargs`), so the workers land on the same pool. An elastic
stage's admission waits for its min workers only (it starts smaller when the pool is short).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from training.config.ray_executor import RAY_STAGES, RayStageConfig
from training.config.ray_executor import RAY_TRAIN_STAGES as TRAINING_STAGES
from contract.names import POOL_LABEL


class PlacementError(RuntimeError):
    """A stage could not get its resources; the message names the stage, pool and resources."""


@dataclass(frozen=True)
class StagePlacement:
    """What one stage reserves: ``len(bundles)`` identical bundles with ``strategy`` on ``pool``."""

    stage: str
    """Stage name (one of :data:`training.config.ray_executor.RAY_STAGES`)."""
    pool: str
    """Pool name; empty = any node."""
    bundle: Mapping[str, float]
    """Resources of one bundle (one worker or task): ``{"CPU": c}`` plus ``{"GPU": g}`` when g > 0."""
    workers: int
    """Number of bundles (of an elastic training stage: its most workers)."""
    strategy: str
    """Ray placement strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."""
    min_workers: int = 0
    """An elastic training stage's fewest workers (``ray.<stage>.workers: {min, max}``); 0 = fixed."""

    @property
    def elastic(self) -> bool:
        """Ray Train sizes the worker group between ``min_workers`` and ``workers``."""
        return 0 < self.min_workers < self.workers

    @property
    def label_selector(self) -> dict[str, str] | None:
        """Node labels every bundle requires (None = any node)."""
        return {POOL_LABEL: self.pool} if self.pool else None

    def describe(self) -> str:
        """``2 x {CPU: 1.0} (STRICT_PACK) on pool 'gpu-spot'`` (elastic: ``2-4 x ...``)."""
        res = ", ".join(f"{k}: {v:g}" for k, v in self.bundle.items())
        where = f"pool {self.pool!r}" if self.pool else "any node"
        count = f"{self.min_workers}-{self.workers}" if self.elastic else str(self.workers)
        return f"{count} x {{{res}}} ({self.strategy}) on {where}"

    def placement_group_kwargs(self) -> dict[str, Any]:
        """Arguments of :func:`ray.util.placement_group` for this reservation (of an elastic stage: its fewest
        workers, what it needs to start)."""
        sel, n = self.label_selector, self.min_workers if self.elastic else self.workers
        return {"bundles": [dict(self.bundle) for _ in range(n)], "strategy": self.strategy,
                "bundle_label_selector": [dict(sel) for _ in range(n)] if sel else None}

    def scaling_kwargs(self, resize_interval_s: float | None = None) -> dict[str, Any]:
        """Arguments of :class:`ray.train.ScalingConfig` that reserve the same bundles on the same pool; an
        elastic stage's ``num_workers`` is ``(min, max)``, checked for room to grow every ``resize_interval_s``."""
        out = {"num_workers": (self.min_workers, self.workers) if self.elastic else self.workers,
               "use_gpu": self.bundle.get("GPU", 0) > 0, "resources_per_worker": dict(self.bundle),
               "placement_strategy": self.strategy, "label_selector": self.label_selector}
        if self.elastic and resize_interval_s is not None:
            out["elastic_resize_monitor_interval_s"] = resize_interval_s
        return out


def _fits(total: Mapping[str, float], need: Mapping[str, float], times: int = 1) -> bool:
    return all(total.get(k, 0.0) + 1e-9 >= v * times for k, v in need.items())


def pool_nodes(nodes: list[Mapping[str, Any]], pool: str) -> list[Mapping[str, Any]]:
    """Alive nodes of ``pool`` (all alive nodes when ``pool`` is empty), from :func:`ray.nodes`."""
    alive = [n for n in nodes if n.get("Alive")]
    if not pool:
        return alive
    return [n for n in alive if (n.get("Labels") or {}).get(POOL_LABEL) == pool]


def pools(nodes: list[Mapping[str, Any]]) -> list[str]:
    """Pool names present among the alive nodes."""
    return sorted({(n.get("Labels") or {}).get(POOL_LABEL) for n in nodes if n.get("Alive")} - {None})


def _declared(declared: Mapping[str, int] | None) -> Mapping[str, int]:
    if declared is not None:
        return declared
    from training.config.sections import ConfigError
    from contract.ray_pools import POOLS_ENV, PoolsError, declared_pools

    try:
        return declared_pools()
    except PoolsError as err:
        raise ConfigError(str(err), POOLS_ENV) from None


def _too_big(stage: str, bundle: Mapping[str, float], where: str, largest: str) -> PlacementError:
    return PlacementError(f"stage {stage}: one worker needs {dict(bundle)} but no node of {where} has that much "
                          f"(largest: {largest}); lower ray.{stage}.cpus / ray.{stage}.gpus")


def plan(stage: str, resources: RayStageConfig, nodes: list[Mapping[str, Any]],
         declared: Mapping[str, int] | None = None) -> StagePlacement:
    """The placement of ``stage`` on the cluster described by ``nodes`` (:func:`ray.nodes`) and
    ``declared`` (pool -> GPUs of one node; None = ``RAGPOOL_RAY_POOLS`` of this process).

    Raises :class:`PlacementError` at once when the request can never be met: a pool neither
    declared nor carried by an alive node, or a bundle larger than every node of the pool (GPUs
    against the declaration when the pool is declared, CPUs against its alive nodes). A pool that
    exists but is busy, or has no node alive yet, is not an error here (:func:`reserved` waits for
    it while Ray's autoscaler adds nodes).
    """
    if stage not in RAY_STAGES:
        raise ValueError(f"unknown stage {stage!r}; allowed: {', '.join(RAY_STAGES)}")
    bundle: dict[str, float] = {}
    if resources.cpus > 0:
        bundle["CPU"] = float(resources.cpus)
    if resources.gpus > 0:
        bundle["GPU"] = float(resources.gpus)
    declared = _declared(declared)
    pool = resources.pool
    members = pool_nodes(nodes, pool)
    where = f"pool {pool!r}" if pool else "the cluster"
    if (pool in declared) if pool else bool(declared):
        # The declaration, not the alive nodes: on an idle cluster none are.
        node_gpus = declared[pool] if pool else max(declared.values())
        if bundle.get("GPU", 0) > node_gpus:
            source = f"GPU {node_gpus} per node as declared" if pool else f"GPU {node_gpus} per node of any declared pool"
            raise _too_big(stage, bundle, where, source)
        # A named pool's alive nodes are its worker group's size (the head is in no pool).
        totals = [n.get("Resources") or {} for n in members] if pool else []
        if totals and not any(_fits(t, bundle) for t in totals):
            raise _too_big(stage, bundle, where, _largest(totals))
        if not totals and "GPU" in bundle:
            totals = [{"GPU": float(node_gpus), "CPU": float("inf")}]
    else:
        if not members:
            known = ", ".join(sorted(set(pools(nodes)) | set(declared))) or "none"
            raise PlacementError(f"stage {stage}: {where} has no nodes in the Ray cluster (pools: {known}); "
                                 f"set ray.{stage}.pool to one of them")
        totals = [n.get("Resources") or {} for n in members]
        if not any(_fits(t, bundle) for t in totals):
            raise _too_big(stage, bundle, where, _largest(totals))
    strategy = resources.strategy
    if strategy == "auto":
        if stage in TRAINING_STAGES and resources.elastic:
            # Ray Train counts the workers that fit over all nodes of the pool (its elastic policy sums them), so
            # the group must be free to span nodes, and to shrink to those left.
            strategy = "PACK"
        elif stage in TRAINING_STAGES:
            # Unknown node size (no node alive, CPU-only bundle): PACK, which still prefers one node.
            strategy = "STRICT_PACK" if any(_fits(t, bundle, resources.workers) for t in totals) else "PACK"
        else:
            strategy = "SPREAD"
    return StagePlacement(stage, pool, bundle, resources.workers, strategy,
                          resources.min_workers if stage in TRAINING_STAGES and resources.elastic else 0)


def _largest(totals: list[Mapping[str, float]]) -> str:
    biggest = max(totals, key=lambda t: (t.get("GPU", 0), t.get("CPU", 0)))
    return f"CPU {biggest.get('CPU', 0):g}, GPU {biggest.get('GPU', 0):g}"


@contextlib.contextmanager
def reserved(placement: StagePlacement, timeout_s: float, name: str = "") -> Iterator[Any]:
    """Reserve ``placement`` (a placement group), wait for it up to ``timeout_s``, release it on exit.

    Yields the ready :class:`ray.util.placement_group.PlacementGroup`; schedule work into it
    with :func:`strategy_for`. Raises :class:`PlacementError` when the pool has no room in time.
    """
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(name=name, **placement.placement_group_kwargs())
    try:
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except GetTimeoutError:
            alive = len(pool_nodes(ray.nodes(), placement.pool))
            raise PlacementError(
                f"stage {placement.stage}: waited {timeout_s:g}s for {placement.describe()} and the pool never "
                f"had room: {alive} node(s) of it alive, held by other runs or stages, and Ray's autoscaler "
                f"added none that fits in time (its worker group at maxReplicas, or nodes slow to come); "
                f"nothing was placed elsewhere. Retry later, or raise ray.placement_timeout_s") from None
        yield pg
    finally:
        remove_placement_group(pg)


def strategy_for(pg: Any, index: int) -> Any:
    """Scheduling strategy that runs a task in bundle ``index`` of ``pg`` (and its children too)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index,
                                            placement_group_capture_child_tasks=True)


def bundle_nodes(pg: Any) -> dict[int, str]:
    """Bundle index -> node id of a ready placement group (for logs and tests)."""
    from ray.util import placement_group_table

    return {int(k): v for k, v in placement_group_table(pg).get("bundles_to_node_id", {}).items()}
