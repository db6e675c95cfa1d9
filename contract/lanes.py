"""Lanes: which workers may claim which queued runs (torch-free; the one home of the lane rules), and what a
lane is made of: the executors, the priorities and the node limit of a run.

A run waits in the ready lists of exactly one lane, one list per priority
(``<namespace>:ready:<prio><suffix>``). A worker claims from a fixed set of lanes, highest
priority first. The lanes:

==========================  =========================  ===================================================
lane (``Lane``)              ready-list suffix          who claims it
==========================  =========================  ===================================================
``Lane()``                   ``""``                     the stack's DEFAULT pool's single-pod workers
                                                        (unpinned single-pod torchrun runs)
``Lane(nodes=N)``            ``:n<N>``                  index 0 of an Indexed Job of N pods of the default pool
``Lane(pool=P)``             ``:pool:<P>``              pool P's single-pod workers (runs with ``pool: P``)
``Lane(nodes=N, pool=P)``    ``:pool:<P>:n<N>``         index 0 of an Indexed Job of N pods of pool P
``Lane("ray")``              ``:ray``                   the CPU worker that submits ray runs to the Ray cluster
==========================  =========================  ===================================================

The DEFAULT pool is the first GPU pool of the stack config (``ragpool:gpuPools``); it also
takes the unpinned lanes, so a run that does not pin ``pool:`` runs there. Ray runs never
pin a pool here (their stages pick pools, ``ray.<stage>.pool``).

Each lane has a *name* safe as a Kubernetes label value and as a list item
(:attr:`Lane.name`: ``torchrun``, ``torchrun.n2``, ``pool.gpu-spot``, ``pool.gpu-spot.n2``,
``ray``; pool names are DNS labels, so the dot never clashes). Workers read the lanes they
claim from :data:`LANES_ENV` (``RAGPOOL_LANES=pool.gpu-spot,torchrun``); :func:`worker_env`
builds that environment, :func:`worker_lanes` the lanes of a worker of one pool.

For KEDA (infra/keda.py): a ScaledJob for the lanes ``worker_lanes(...)`` triggers on
``[key for lane in lanes for key in lane.ready_keys(namespace)]`` and runs a worker whose
environment includes ``worker_env(lanes)``; the summed LLEN of those lists is the number
of runs waiting for such a worker (see docs/DESIGN.md, "Lanes and the keeper").
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from contract.env import NNODES_ENV


class Executor(StrEnum):
    """How a run runs (a run spec's ``executor``); each compares equal to its value."""

    TORCHRUN = "torchrun"
    """``torchrun`` on a GPU worker's pod (one pod, or an Indexed Job of ``nodes`` pods)."""
    RAY = "ray"
    """``training.ray.driver`` as a Ray job on the namespace's Ray cluster, submitted by a worker whose
    RAGPOOL_EXECUTORS includes ray."""


EXECUTORS: tuple[str, ...] = tuple(executor.value for executor in Executor)
"""The executors' names, in :class:`Executor`'s order (``torchrun``, ``ray``)."""
PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
"""Queue priorities, highest first."""
DEFAULT_PRIORITY = "normal"
"""The priority of a run whose spec names none (training/scheduler/spec.py ``RunSpec.priority``)."""
MAX_NODES = 64
"""Largest ``nodes`` of a run (pods of its Indexed Job)."""

READY_STEM = "ready:"
"""Stem of every ready list under the namespace prefix (``queue_records.Key.READY`` is this)."""
NODES_SUFFIX = ":n"
"""Multi-node torchrun runs of N nodes wait in ``ready:<prio>[:pool:<P>]:n<N>``."""
POOL_SUFFIX = ":pool:"
"""Runs pinned to pool P wait in ``ready:<prio>:pool:<P>[...]``."""
RAY_LANE = ":ray"
"""``executor: ray`` runs wait in ``ready:<prio>:ray``."""
LANES_ENV = "RAGPOOL_LANES"
"""Worker environment: the lane names (:attr:`Lane.name`, comma-separated) it claims, exactly."""
PRIORITIES_ENV = "RAGPOOL_PRIORITIES"
"""Worker environment: the priorities (:data:`PRIORITIES`, comma-separated) whose runs it claims; unset or empty:
every priority. A ScaledJob per (lanes, priority) starts workers that claim only its priority, so the Job's Kueue
priority (``kueue.x-k8s.io/priority-class``) is its run's (docs/DESIGN.md, "Run priorities in Kueue")."""
POOLS_ENV = "RAGPOOL_POOLS"
"""Submitter environment: the stack's GPU pool names, comma-separated (the stack's ``gpuPools``
output, first = default pool). When set, ``ragpool submit`` refuses a ``pool:`` not listed."""
SERVED_LANES_ENV = "RAGPOOL_SERVED_LANES"
"""Submitter environment: the lanes that have a worker (a KEDA ScaledJob) in the namespace the run goes
to, lane names comma-separated (the stack's ``servedLanes`` output for that namespace; infra/keda.py
``served_lanes`` of the namespace's ``worker_kinds``). When set, ``ragpool submit`` refuses a run whose
lane is not listed (training/scheduler/fit.py): it would wait forever. Unset: not checked."""
LANE_LABEL_PREFIX = "lane.ragpool.io/"
"""Kubernetes label key prefix: a worker Job and its pods carry ``lane.ragpool.io/<lane name>: "true"``
for *every* lane their worker claims (:func:`lane_labels`; a Job of the default pool claims its pinned
lane and the unpinned one), and ``ragpool status --cluster`` selects a lane's Jobs and pods by
:func:`lane_selector`. A lane name is a valid label name (at most 63 characters: pool names are short)."""

_POOL_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_NAME_RE = re.compile(r"(?:(torchrun)|pool\.([a-z0-9-]+))(?:\.n([0-9]+))?|(ray)")


class LaneError(ValueError):
    """A lane, lane name or lane list is invalid; the message names it and the rule."""


@dataclass(frozen=True)
class Lane:
    """Which workers may claim a run: its executor, pods per run, and pinned pool (or None)."""

    executor: str = "torchrun"
    """``torchrun`` or ``ray`` (:data:`EXECUTORS`)."""
    nodes: int = 1
    """Pods per run (an Indexed Job of this many pods claims it); always 1 for ray."""
    pool: str | None = None
    """The GPU pool the run is pinned to; None = the stack's default pool (torchrun) or none (ray)."""

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise LaneError(f"unknown executor {self.executor!r}: a lane's executor is one of {', '.join(EXECUTORS)}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise LaneError(f"lane nodes {self.nodes!r}: must be an integer in [1, {MAX_NODES}]")
        if self.pool is not None and not (isinstance(self.pool, str) and _POOL_RE.fullmatch(self.pool)):
            raise LaneError(f"lane pool {self.pool!r}: must be a pool name (a DNS label)")
        if self.executor == "ray" and (self.nodes != 1 or self.pool is not None):
            raise LaneError("the ray lane has nodes 1 and no pool: a ray run's stages pick their pools")

    @property
    def suffix(self) -> str:
        """The ready-list suffix: ``""``, ``:n<N>``, ``:pool:<P>``, ``:pool:<P>:n<N>`` or ``:ray``."""
        if self.executor == "ray":
            return RAY_LANE
        pool = f"{POOL_SUFFIX}{self.pool}" if self.pool else ""
        return pool + (f"{NODES_SUFFIX}{self.nodes}" if self.nodes > 1 else "")

    @property
    def name(self) -> str:
        """A label-safe name: ``torchrun[.n<N>]``, ``pool.<P>[.n<N>]`` or ``ray`` (:func:`parse_lane` reads it)."""
        if self.executor == "ray":
            return "ray"
        head = f"pool.{self.pool}" if self.pool else "torchrun"
        return head + (f".n{self.nodes}" if self.nodes > 1 else "")

    def ready_lists(self, priorities: Sequence[str] = PRIORITIES) -> list[str]:
        """The lane's ready-list key names under the namespace prefix, one per priority (of ``priorities``, default
        every one), in claim order (highest priority first): ``["ready:high<suffix>", "ready:normal<suffix>", ...]``."""
        return [ready_list(prio, self.suffix) for prio in PRIORITIES if prio in priorities]

    def ready_keys(self, namespace: str, priorities: Sequence[str] = PRIORITIES) -> list[str]:
        """:meth:`ready_lists` as full Redis keys of the queue ``namespace`` (e.g. ``ragpool``)."""
        return [f"{namespace}:{key}" for key in self.ready_lists(priorities)]


def ready_list(priority: str, lane_suffix: str = "") -> str:
    """Name (under the prefix) of the ready list for ``priority`` runs of the lane ``lane_suffix``."""
    return READY_STEM + priority + lane_suffix


def lane_of(executor: str = "torchrun", nodes: int = 1, pool: str | None = None) -> Lane:
    """The lane of a run with this executor, node count and pinned pool (ray: nodes/pool ignored,
    the spec refuses ``pool`` with ray and ``nodes`` > 1 with ray)."""
    if executor == "ray":
        return Lane("ray")
    return Lane(executor, nodes, pool or None)


def parse_lane(name: str) -> Lane:
    """The lane named ``name`` (:attr:`Lane.name`); raises :class:`LaneError`."""
    m = _NAME_RE.fullmatch(name.strip()) if isinstance(name, str) else None
    if not m:
        raise LaneError(f"{LANES_ENV}: lane {str(name)[:80]!r} is not one of torchrun, torchrun.n<N>, "
                        "pool.<pool>, pool.<pool>.n<N>, ray")
    if m.group(4):
        return Lane("ray")
    nodes = int(m.group(3)) if m.group(3) else 1
    lane = Lane("torchrun", nodes, m.group(2))
    if lane.name != name.strip():  # n1, n007: one spelling per lane
        raise LaneError(f"{LANES_ENV}: lane {name!r} is spelled {lane.name!r}")
    return lane


def parse_lane_set(text: str) -> tuple[Lane, ...]:
    """``"pool.a,torchrun,torchrun.n2"`` -> lanes in that order, duplicates dropped, any node counts
    (:data:`SERVED_LANES_ENV`); empty text: no lane. Raises :class:`LaneError` on a bad name."""
    return tuple(dict.fromkeys(parse_lane(item) for item in text.split(",") if item.strip()))


def format_lane_set(lanes: Iterable[Lane]) -> str:
    """The :data:`SERVED_LANES_ENV` value of ``lanes`` (duplicates dropped, sorted by name)."""
    return ",".join(sorted({lane.name for lane in lanes}))


def parse_lanes(text: str) -> tuple[Lane, ...]:
    """``"pool.a,torchrun"`` -> lanes in that order (duplicates dropped); raises :class:`LaneError`
    when empty or when the lanes differ in ``nodes`` (one worker Job has one pod count)."""
    lanes = parse_lane_set(text)
    if not lanes:
        raise LaneError(f"{LANES_ENV} is set but names no lane")
    if len({lane.nodes for lane in lanes}) > 1:
        raise LaneError(f"{LANES_ENV}={text!r}: the lanes of one worker must have the same node count")
    return lanes


def format_lanes(lanes: Iterable[Lane]) -> str:
    """The :data:`LANES_ENV` value of ``lanes`` (what :func:`parse_lanes` reads back)."""
    return ",".join(lane.name for lane in lanes)


def worker_lanes(pool: str | None, *, is_default_pool: bool, nodes: int = 1,
                 executors: Sequence[str] = ("torchrun",)) -> tuple[Lane, ...]:
    """The lanes a worker of ``pool`` claims, in the order it prefers them: runs pinned to its pool,
    then (default pool only) the unpinned runs of the same node count, then the ray lane if
    ``ray`` is among ``executors`` (the CPU Ray worker: ``worker_lanes(None, is_default_pool=False,
    executors=("ray",))``)."""
    lanes: list[Lane] = []
    for executor in executors:
        if executor == "ray":
            lanes.append(Lane("ray"))
            continue
        if pool is not None:
            lanes.append(Lane(executor, nodes, pool))
        if is_default_pool or pool is None:
            lanes.append(Lane(executor, nodes))
    if not lanes:
        raise LaneError("a worker needs at least one executor")
    parse_lanes(format_lanes(lanes))  # the same rules as the environment
    return tuple(dict.fromkeys(lanes))


def lane_labels(lanes: Iterable[Lane]) -> dict[str, str]:
    """The labels of a worker Job (and its pod template) whose worker claims ``lanes``."""
    return {f"{LANE_LABEL_PREFIX}{lane.name}": "true" for lane in lanes}


def lane_selector(lane: Lane) -> str:
    """The label selector of the worker Jobs and pods that claim ``lane`` (``kubectl get -l``)."""
    [(key, value)] = lane_labels([lane]).items()
    return f"{key}={value}"


def worker_env(lanes: Sequence[Lane], priorities: Sequence[str] | None = None) -> dict[str, str]:
    """Environment that makes ``python -m training.worker`` claim exactly ``lanes``:
    ``RAGPOOL_LANES`` and ``RAGPOOL_NNODES`` (their node count), and with ``priorities`` only runs of those
    (``RAGPOOL_PRIORITIES``). A multi-node Job adds ``RAGPOOL_WORKER_GROUP`` and ``RAGPOOL_RDZV_HOST`` (see the
    worker's docstring)."""
    text = format_lanes(lanes)
    parsed = parse_lanes(text)
    env = {LANES_ENV: text, NNODES_ENV: str(parsed[0].nodes)}
    if priorities is not None:
        env[PRIORITIES_ENV] = format_priorities(parse_priorities(",".join(priorities)))
    return env


def parse_priorities(text: str) -> tuple[str, ...]:
    """``"low,high"`` -> ``("high", "low")``: the priorities named, in claim order (:data:`PRIORITIES`); empty
    text: every priority. Raises :class:`LaneError` naming :data:`PRIORITIES_ENV` on an unknown one."""
    names = {item.strip() for item in text.split(",") if item.strip()}
    unknown = sorted(names - set(PRIORITIES))
    if unknown:
        raise LaneError(f"{PRIORITIES_ENV}={text!r}: {', '.join(map(repr, unknown))} is not a priority; "
                        f"use some of {', '.join(PRIORITIES)} (comma-separated), or leave it unset for every one")
    return tuple(p for p in PRIORITIES if p in names) or PRIORITIES


def format_priorities(priorities: Iterable[str]) -> str:
    """The :data:`PRIORITIES_ENV` value of ``priorities`` (claim order)."""
    chosen = set(priorities)
    return ",".join(p for p in PRIORITIES if p in chosen)


def priorities_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The priorities a worker claims: :data:`PRIORITIES_ENV` (:func:`parse_priorities`), every one when unset."""
    env = os.environ if environ is None else environ
    return parse_priorities(env.get(PRIORITIES_ENV, ""))


def lanes_from_env(executors: Sequence[str], nodes: int,
                   environ: Mapping[str, str] | None = None) -> tuple[Lane, ...]:
    """The lanes a worker claims: :data:`LANES_ENV` when set (its node count must equal
    ``nodes`` and its executors be among ``executors`` when ``RAGPOOL_EXECUTORS`` was set), else the
    unpinned lanes of ``executors`` and ``nodes`` (the behaviour before pools: manual use)."""
    env = os.environ if environ is None else environ
    raw = env.get(LANES_ENV, "")
    if not raw.strip():
        return tuple(dict.fromkeys(lane_of(e, nodes) for e in executors))
    lanes = parse_lanes(raw)
    if lanes[0].nodes != nodes:
        raise LaneError(f"{LANES_ENV}={raw!r} are lanes of {lanes[0].nodes}-pod runs but RAGPOOL_NNODES={nodes}")
    return lanes


def declared_pools(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The stack's GPU pool names from :data:`POOLS_ENV` (first = default), or None when unset."""
    env = os.environ if environ is None else environ
    if POOLS_ENV not in env:
        return None
    return tuple(p.strip() for p in env[POOLS_ENV].split(",") if p.strip())


def declared_lanes(environ: Mapping[str, str] | None = None) -> tuple[Lane, ...] | None:
    """The lanes of :data:`SERVED_LANES_ENV` (empty: the namespace has no worker at all), or None when unset."""
    env = os.environ if environ is None else environ
    if SERVED_LANES_ENV not in env:
        return None
    try:
        return parse_lane_set(env[SERVED_LANES_ENV])
    except LaneError as err:
        raise LaneError(str(err).replace(LANES_ENV, SERVED_LANES_ENV)) from None


def known_lanes(suffixes: Iterable[str]) -> list[Lane]:
    """Lanes from ready-list suffixes seen in a queue (``run_queue`` keeps them in its ``lanes``
    set), plus the unpinned single-pod lane; unknown suffixes (written by a newer version) are skipped."""
    out = {Lane()}
    for suffix in suffixes:
        lane = lane_from_suffix(suffix)
        if lane is not None:
            out.add(lane)
    return sorted(out, key=lambda lane: (lane.executor, lane.pool or "", lane.nodes))


def lane_of_ready_list(name: str) -> tuple[str, Lane] | None:
    """``(priority, lane)`` of a ready-list name under the prefix (``ready:high:pool:a``), or None."""
    if not name.startswith(READY_STEM):
        return None
    rest = name[len(READY_STEM):]
    for prio in PRIORITIES:
        if rest.startswith(prio):
            lane = lane_from_suffix(rest[len(prio):])
            if lane is not None:
                return prio, lane
    return None


def lane_from_suffix(suffix: str) -> Lane | None:
    """The lane whose :attr:`Lane.suffix` is ``suffix``, or None when no lane has it."""
    if suffix == RAY_LANE:
        return Lane("ray")
    pool, rest = None, suffix
    if rest.startswith(POOL_SUFFIX):
        pool, _, tail = rest[len(POOL_SUFFIX):].partition(":")
        rest = f":{tail}" if tail else ""
    nodes = 1
    if rest:
        if not rest.startswith(NODES_SUFFIX) or not rest[len(NODES_SUFFIX):].isdigit():
            return None
        nodes = int(rest[len(NODES_SUFFIX):])
    try:
        lane = Lane("torchrun", nodes, pool)
    except LaneError:
        return None
    return lane if lane.suffix == suffix else None
