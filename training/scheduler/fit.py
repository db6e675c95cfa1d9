"""Does a run fit the stack it is submitted to? (torch-free; ``ragpool submit`` runs it before enqueueing)

Two facts of the stack reach the submitter as environment variables, each from a stack output
(README "Runs"), like ``RAGPOOL_POOLS`` (``gpuPools``) and ``RAGPOOL_RAY_POOLS`` (``rayPools``):

- ``RAGPOOL_SERVED_LANES`` (``lanes.SERVED_LANES_ENV``; stack output ``servedLanes``, one value per
  training namespace): the lanes that have a worker (a KEDA ScaledJob) in the namespace the run is
  submitted to. A run whose lane is not among them would wait forever: refused, exit 2, naming
  ``pool`` (no lane of its pool here, or none for unpinned runs), ``nodes`` (its pool has lanes here,
  but no ``n<N>`` gang of that size) or ``executor`` (no ray lane), the namespace and the lanes it has.
- ``RAGPOOL_POOL_GPUS`` (:data:`POOL_GPUS_ENV`; stack output ``poolGpus``): per GPU pool, the GPUs of
  one worker pod and the memory of one GPU (the smallest among the pool's instance types,
  infra/reference/gpu_memory.yaml): ``gpu-spot=1:24GiB,gpu-ondemand=8:80GiB``; a pool with an instance
  family whose GPU memory is not recorded has no ``:<N>GiB`` (``gpu-x=8``). (Not ``x``: in
  ``RAGPOOL_RAY_POOLS`` ``GPUSxNODES`` multiplies GPUs by nodes.) A training stage whose model's
  state per rank cannot fit that memory (training/rank_memory.py) is refused, exit 2, naming the
  stage's ``parallelism.strategy`` key and the arithmetic. It is skipped, with a note, when the pool's
  memory is unknown or the model directory cannot be read from the submitting machine; the packaged
  default models (``model: ""``) are tiny and not checked.
  With ``:mem<M>GiB`` (the worker pod's memory limit, sized from the instance's RAM by
  infra/gpu_memory.py), the stage's host-memory peaks are checked too (training/rank_memory.py
  ``host_fits``): the checkpoint staging of the pod's ranks (refused naming
  ``parallelism.strategy``: shard over more ranks) and the rank-0 gather of the full model at the
  end of the stage (refused naming ``pool``, or ``ray.<stage>.pool``: only a pool with larger worker
  pods holds it). Without ``:mem`` that check is not made.

Either variable unset: that check is not made (what ``ragpool submit`` did before them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from training.rank_memory import (GIB, STATE_BYTES_PER_PARAMETER, USABLE_FRACTION, ModelSizeError, fits, host_fits,
                                  model_parameters)
from contract.lanes import SERVED_LANES_ENV, LaneError, declared_lanes, declared_pools, lane_of
from contract.env import NAMESPACE_ENV
from contract.names import DEFAULT_NAMESPACE
from contract.pool_gpus import POOL_GPUS_ENV, FitError, PoolGpus, declared_pool_gpus
from training.scheduler.spec import RunSpec, _spec_field


def _queue_namespace(env: Mapping[str, str]) -> str:
    return env.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE


def lane_problems(spec: RunSpec, environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``[(key, message)]`` when :data:`SERVED_LANES_ENV` is set and the run's lane is not in it."""
    env = os.environ if environ is None else environ
    try:
        served = declared_lanes(env)
    except LaneError as err:
        return [("(environment)", str(err))]
    if served is None:
        return []
    lane = lane_of(spec.executor, spec.nodes, spec.pool)
    if lane in served:
        return []
    have = ", ".join(sorted(x.name for x in served)) or "none"
    where = f"namespace {_queue_namespace(env)!r} ({SERVED_LANES_ENV}: {have})"
    if spec.executor == "ray":
        return [("executor", f"no worker in {where} takes executor: ray runs (lane {lane.name}): it would wait "
                             "forever; submit it where a Ray cluster runs, or as a torchrun run")]
    same_pool = [x for x in served if x.executor == "torchrun" and x.pool == lane.pool]
    what = f"pool {spec.pool!r}" if spec.pool else "unpinned runs (the stack's default pool)"
    if same_pool:
        most = max(x.nodes for x in same_pool)
        return [("nodes", f"no worker in {where} takes {spec.nodes}-node runs of {what} (lane {lane.name}): it "
                          f"would wait forever; this namespace runs gangs of at most {most} node(s) of it")]
    pools = sorted({x.pool for x in served if x.pool})
    hint = f"pin one of its pools: {', '.join(pools)}" if pools else "it has no GPU worker"
    return [("pool", f"no worker in {where} takes {what} (lane {lane.name}): it would wait forever (the "
                     f"namespace's GPU quota fits no worker of that pool); {hint}")]


def _default_pool(pools: Mapping[str, PoolGpus], env: Mapping[str, str]) -> str | None:
    """The stack's default pool: the first of ``RAGPOOL_POOLS``, else the first of ``RAGPOOL_POOL_GPUS``."""
    named = declared_pools(env)
    if named:
        return named[0]
    return next(iter(pools), None)


def memory_problems(spec: RunSpec, shared_root: str,
                    environ: Mapping[str, str] | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """``(problems, notes)`` of the per-rank memory check of each training stage (see the module doc)."""
    from training.config.run import load_run_config

    env = os.environ if environ is None else environ
    try:
        pools = declared_pool_gpus(env)
    except FitError as err:
        return [("(environment)", str(err))], []
    if pools is None:
        return [], []
    cfg = load_run_config(spec.to_training_config(shared_root))
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    for stage in spec.stages:
        section = getattr(cfg, stage)
        par = getattr(section, "parallelism", None)
        if par is None or not section.model:
            continue  # not a training stage, or the packaged default model (tiny)
        if spec.executor == "ray":
            ray = cfg.ray.stage(stage)
            pool, world, per_node = ray.pool, ray.workers, ray.workers
            pool_key = _spec_field(spec, f"ray.{stage}.pool")
            # Ray Train workers of one Ray worker pod (ray.<stage>.gpus GPUs each).
            per_pod = min(world, pools[pool].gpus // max(1, ray.gpus)) if pool in pools else 1
        else:
            pool = spec.pool or _default_pool(pools, env)
            per_node = spec.gpus_per_node or (pools[pool].gpus if pool in pools else 0)
            world = spec.nodes * per_node
            pool_key, per_pod = "pool", per_node  # the spec's own field
        skip = f"memory check of {stage} skipped"
        if not pool or pool not in pools:
            notes.append(f"{skip}: pool {pool or '(any)'!r} is not in {POOL_GPUS_ENV}")
            continue
        gib, mem = pools[pool].gib, pools[pool].mem_gib
        if gib is None:
            notes.append(f"{skip}: pool {pool!r} has an instance family whose GPU memory is not recorded "
                         "(infra/reference/gpu_memory.yaml)")
            if mem is None:
                continue
        try:
            params, how = model_parameters(section.model)
        except (ModelSizeError, OSError) as err:
            notes.append(f"{skip}: cannot read the size of {section.model} from here ({err}); mount the shared "
                         "root (RAGPOOL_SHARED_ROOT) to check it")
            continue
        model = f"the {stage} model ({Path(section.model).name}, {params} parameters from {how})"
        ok, arithmetic = fits(params, par.strategy, world, per_node, gib) if gib is not None else (True, "")
        if not ok:
            need = math.ceil(STATE_BYTES_PER_PARAMETER * params / (USABLE_FRACTION * (gib or 0) * GIB))
            problems.append((_spec_field(spec, f"{stage}.parallelism.strategy"),
                             f"{model} cannot fit a GPU of pool {pool!r}: {arithmetic}; shard it over at least "
                             f"{need} ranks (fsdp over nodes x gpus_per_node, or hsdp over a node's GPUs)"))
            continue
        if mem is None:
            continue  # a stack older than the pod memory in RAGPOOL_POOL_GPUS: not checked, as before
        staging_ok, gather_ok, host = host_fits(params, par.strategy, world, per_node, per_pod, mem)
        if not gather_ok:
            problems.append((pool_key,
                             f"{model} cannot be gathered on rank 0 at the end of the stage in a worker pod of pool "
                             f"{pool!r} (it would be OOM-killed, retried and dead-lettered): {host}; pick a pool "
                             f"whose worker pods have more memory ({POOL_GPUS_ENV} :mem<M>GiB)"))
        elif not staging_ok:
            problems.append((_spec_field(spec, f"{stage}.parallelism.strategy"),
                             f"{model} cannot stage its checkpoint in a worker pod of pool {pool!r} (it would be "
                             f"OOM-killed at its first checkpoint): {host}; shard it over more ranks (fsdp over "
                             f"more nodes) or pick a pool whose worker pods have more memory"))
    return problems, notes


def _encoder_dim(model_dir: Path) -> int | None:
    """``hidden_size`` of a local encoder directory's ``config.json`` (None when it cannot be read)."""
    import json

    try:
        return int(json.loads((model_dir / "config.json").read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def index_problems(spec: RunSpec, shared_root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The index settings against the corpus and encoder when this machine can see them (the shared
    storage mounted, the corpus prepared, the encoder a local directory): ``nlist`` against the corpus's
    passages, ``pq_m`` dividing the encoder's dimension, ``2**pq_bits`` centroids trainable
    (:func:`training.components.faiss_index.check_settings`, which the stage runs again before encoding)."""
    from training.components.corpus import MANIFEST, PREPARED_DIR
    from training.components.faiss_index import check_settings
    from training.config.run import load_run_config
    from training.config.sections import ConfigError

    if "index" not in spec.stages:
        return [], []
    try:
        cfg = load_run_config(spec.to_training_config(shared_root))
    except ConfigError:
        return [], []  # the spec's own validation reports it
    manifest = Path(shared_root) / cfg.data.corpus / PREPARED_DIR / MANIFEST
    dim = _encoder_dim(Path(cfg.retriever.model)) if cfg.retriever.model else None
    if not manifest.is_file() or dim is None:
        return [], [f"index settings checked when the stage starts (corpus manifest {manifest} or the encoder's "
                    "config.json not readable here)"] if cfg.index.kind != "flat" else []
    import json

    rows = int(json.loads(manifest.read_text())["rows"])
    ic = cfg.index
    return [(_spec_field(spec, msg.split("=", 1)[0]), msg.split(": ", 1)[1])
            for msg in check_settings(ic.kind, rows, dim, ic.nlist, ic.pq_m, ic.pq_bits)], []


def gpu_count_problems(spec: RunSpec, environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``gpus_per_node`` of a torchrun run against the GPUs of one worker pod of its pool (:data:`POOL_GPUS_ENV`):
    more processes than GPUs would never start (torchrun ranks each take a GPU). Not checked when the variable
    is unset or does not list the pool (the memory check notes that)."""
    env = os.environ if environ is None else environ
    if spec.executor != "torchrun" or spec.gpus_per_node is None:
        return []
    try:
        pools = declared_pool_gpus(env)
    except FitError:
        return []  # memory_problems reports the variable
    if not pools:
        return []
    pool = spec.pool or _default_pool(pools, env)
    if pool not in pools or spec.gpus_per_node <= pools[pool].gpus:
        return []
    return [("gpus_per_node", f"{spec.gpus_per_node} processes per node, but a worker pod of pool {pool!r} has "
                              f"{pools[pool].gpus} GPU(s) ({POOL_GPUS_ENV}); use at most {pools[pool].gpus}, or "
                              "leave it unset (all the pod's GPUs), or more nodes")]


def elastic_pool_problems(spec: RunSpec, shared_root: str,
                          environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """An elastic torchrun run without ``gpus_per_node`` runs a rank per GPU of its worker pod, which the spec's
    own batch check (training/scheduler/spec.py ``elastic_problems``) cannot know and takes as 1. With the pool's
    GPUs in :data:`POOL_GPUS_ENV` the same check runs at that many ranks per node: a batch that only holds at one
    rank per node is refused here rather than by every rank at start. Not checked when the variable is unset or
    does not list the pool."""
    import dataclasses

    from training.config.run import load_run_config
    from training.scheduler.spec import elastic_problems

    env = os.environ if environ is None else environ
    if spec.executor != "torchrun" or spec.min_nodes is None or spec.gpus_per_node is not None:
        return []
    try:
        pools = declared_pool_gpus(env)
    except FitError:
        return []  # memory_problems reports the variable
    pool = spec.pool or _default_pool(pools or {}, env)
    if not pools or pool not in pools or pools[pool].gpus == 1:
        return []
    gpus = pools[pool].gpus
    cfg = load_run_config(spec.to_training_config(shared_root))
    return [(key, f"{message} ({gpus} ranks per node: gpus_per_node is unset, so every GPU of a pool {pool!r} "
                  f"worker pod, {POOL_GPUS_ENV})")
            for key, message in elastic_problems(dataclasses.replace(spec, gpus_per_node=gpus), cfg)]


def fit_problems(spec: RunSpec, shared_root: str,
                 environ: Mapping[str, str] | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """``(problems, notes)`` of every submit check, on both submit paths (the run API's and the direct CLI's):
    the data and model directories on the shared storage (training/scheduler/submit_checks.py), the lane check,
    ``gpus_per_node`` against the pool, an elastic run's batch at the pool's GPUs per node, then the memory check,
    then the index settings."""
    from training.scheduler.submit_checks import storage_problems

    storage, storage_notes = storage_problems(spec, shared_root)
    problems, notes = memory_problems(spec, shared_root, environ)
    index, index_notes = index_problems(spec, shared_root)
    return (storage + lane_problems(spec, environ) + gpu_count_problems(spec, environ)
            + elastic_pool_problems(spec, shared_root, environ) + problems + index,
            storage_notes + notes + index_notes)
