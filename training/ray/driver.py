"""Run a run's stages on Ray, with the same outputs under the shared root as the torchrun path.

    python -m training.ray.driver --config RUN.yaml [--key=value ...]

(as a Ray job: ``ray job submit --address http://HEAD:8265 -- python -m training.ray.driver --config
RUN.yaml``; that is what a queue worker does for an ``executor: ray`` run). The Ray cluster is
``ray.address``, else ``RAY_ADDRESS``, else a local Ray started here.

The run becomes one chain of Ray tasks, each stage's task taking the previous stage's result
(an object ref: small summaries and paths; bulk data stays on shared storage), so the whole
chain is submitted at once and each stage starts the moment its input is ready:

- ``prepare``: the data files validated in parallel CPU tasks (SPREAD over the pool);
- ``retriever`` / ``generator``: Ray Train ``TorchTrainer`` worker groups running the stage's own
  ``run()`` (the shared training loop, models, checkpoints and metrics) in the process group Ray
  Train set up; checkpoints land in ``runs/<run_id>/<stage>/checkpoints`` as under torchrun, and
  ``FailureConfig(max_failures=ray.max_failures)`` restarts a failed worker group, which resumes
  from the newest verified checkpoint; an elastic stage (``ray.<stage>.workers: {min, max}``) runs with
  ``num_workers=(min, max)``: it restarts smaller when a node is lost and grows back when the pool has room
  again (docs/DESIGN.md "Elastic Ray Train stages");
- ``index``: the corpus encoded as one task a part (``index.part_rows`` rows) into the same
  ``embeddings/`` parts as :mod:`training.index`'s ranks, then built (or for ``ivfpq`` trained, added part
  by part and merged) by tasks into the same ``index.faiss`` and ``_COMPLETE``;
- ``evaluate``: the evaluation stage as a Ray task, writing the same ``report.json``.

The tasks' and Ray Train workers' bodies are training/ray/tasks.py; this module plans, places and chains them.

Every stage reserves its own placement group on its pool (:mod:`training.ray.placement`) and
releases it when it ends; on an idle cluster (worker groups at 0) the pending group makes Ray's
autoscaler add a node of the pool, within ``ray.placement_timeout_s``. Completed stages are skipped by the same rule as under torchrun
(:func:`training.components.stage.completed`: ``_COMPLETE`` markers and config fingerprints), so a
run can be started by one
executor and resumed or evaluated by the other. Ray Train's own run state goes to
``runs/<run_id>/ray/``.

Exit codes (:mod:`contract.exit_codes`): 0 done, 2 bad config or data, 4 a stage's pool had no
room within ``ray.placement_timeout_s`` or cannot hold it, 1 anything else.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from training.config.run import RunConfig, load_run_config, split_cli
from training.config.sections import ConfigError
from contract.exit_codes import BAD_INPUT, FAILED, OK, UNAVAILABLE
from training.ray.job import DRIVER_ERROR_PREFIX
from training.ray.placement import TRAINING_STAGES, PlacementError, StagePlacement, plan, reserved, strategy_for
from training.ray.tasks import (StageFailed, add_part_task, corpus_rows, encode_part_task, evaluate_task,
                                finish_index_task, remote_task, train_index_task, train_worker, validate_file)
from contract.env import ELASTIC_NODES_ENV, RAY_NOTICE_DIR_ENV
from contract.paths import SHARED_ROOT_ENV, scoped_environ
from contract.ray_pools import POOLS_ENV

PREPARE = "prepare"
RAY_STORAGE_DIR = "ray"
"""Ray Train's run state (not the stages' outputs) under ``runs/<run_id>/``."""
# Passed to the stage tasks and Ray Train workers when set here: the Hugging Face offline switch, the
# import path, the namespace's declared pools (the stage tasks plan against them: placement.plan), the
# training loop's step-hook modules (its HOOKS_ENV; tests inject faults through them) and the hooks' own
# variables (RAGPOOL_FAULT_*).
_WORKER_ENV = ("HF_HUB_OFFLINE", "PYTHONPATH", SHARED_ROOT_ENV, POOLS_ENV, RAY_NOTICE_DIR_ENV)
_WORKER_ENV_PREFIXES = ("RAGPOOL_FAULT_",)


# --------------------------------------------------------------------------- connection


def connect(cfg: RunConfig, **local: Any) -> None:
    """Join the configured Ray cluster (no-op when already connected); ``local`` goes to a local start."""
    import ray

    if ray.is_initialized():
        return
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS", "")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        # "local": always a new local Ray. Without an address ray.init() first looks for a running one (Ray 2.58
        # ray/_private/services.py canonicalize_bootstrap_address -> get_ray_address_from_environment: the GCS
        # processes on the machine), so it would join someone else's cluster, or fail with "Found multiple active
        # Ray instances" when there are two.
        ray.init(address="local", include_dashboard=False, log_to_driver=True, **local)


def _nodes() -> list[dict[str, Any]]:
    import ray

    return ray.nodes()


def _worker_env() -> dict[str, str]:
    from training.components.loop import HOOKS_ENV

    names = (*_WORKER_ENV, HOOKS_ENV)
    return {k: v for k, v in os.environ.items() if k in names or k.startswith(_WORKER_ENV_PREFIXES)}


# --------------------------------------------------------------------------- stages (run in coordinator tasks)


def run_prepare(cfg: RunConfig, placement: StagePlacement) -> dict[str, Any]:
    import ray

    files = [("corpus", cfg.data.corpus), ("qa_train", cfg.data.qa_train), ("qa_eval", cfg.data.qa_eval)]
    task = ray.remote(validate_file)
    with reserved(placement, cfg.ray.placement_timeout_s, f"{cfg.run_id}-{PREPARE}") as pg:
        refs = {kind: task.options(num_cpus=placement.bundle.get("CPU", 0), num_gpus=0, max_retries=0,
                                   scheduling_strategy=strategy_for(pg, i % placement.workers))
                .remote(cfg.shared_root, rel, kind, str(cfg.run_dir()))
                for i, (kind, rel) in enumerate(files)}
        return {kind: ray.get(ref) for kind, ref in refs.items()}


def run_training(cfg: RunConfig, stage: str, placement: StagePlacement) -> dict[str, Any]:
    from ray.train import FailureConfig
    from ray.train import RunConfig as TrainRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.constants import WORKER_GROUP_START_TIMEOUT_S_ENV_VAR

    from training.elastic.sizes import NodeRange

    # Admission: wait (bounded) until the pool has room for the whole worker group (an elastic one: its min),
    # then hand the reservation to Ray Train, which reserves the same bundles on the same pool.
    with reserved(placement, cfg.ray.placement_timeout_s, f"{cfg.run_id}-{stage}-admission"):
        pass
    env_vars = _worker_env()
    if placement.elastic:  # the ranks keep the global batch at every worker count (training/elastic/sizes.py)
        env_vars[ELASTIC_NODES_ENV] = NodeRange(placement.min_workers, placement.workers).to_env()
    start_timeout = {WORKER_GROUP_START_TIMEOUT_S_ENV_VAR: str(cfg.ray.elastic_start_timeout_s)} \
        if placement.elastic else {}
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"cfg": cfg.to_dict(), "stage": stage},
        scaling_config=ScalingConfig(**placement.scaling_kwargs(cfg.ray.resize_interval_s)),
        run_config=TrainRunConfig(
            name=f"{cfg.run_id}-{stage}", storage_path=str(cfg.run_dir() / RAY_STORAGE_DIR),
            # Failures (a crash, a node lost without notice) spend max_failures; preemptions (a node drained
            # with Ray's preemption reason) have their own, unbounded budget; an elastic resize spends neither.
            failure_config=FailureConfig(max_failures=cfg.ray.max_failures, max_preemption_failures=-1),
            worker_runtime_env={"env_vars": env_vars}),
    )
    with scoped_environ(start_timeout):  # the trainer hands it to its controller (Ray Train's ENV_VARS_TO_PROPAGATE)
        result = trainer.fit()
    metrics = dict(result.metrics or {})
    if result.error is not None:
        raise result.error
    if metrics.get("exit_code", OK) != OK:
        raise StageFailed(stage, int(metrics["exit_code"]))
    return metrics


def run_index(cfg: RunConfig, placement: StagePlacement) -> dict[str, Any]:
    """Index stage as Ray tasks: one task a part (the resume unit, written to the same files as a torchrun
    rank's, so either executor resumes the other's parts), then for ivfpq one training task, one add task a
    part and the merge; for the small kinds one build task. Plain tasks rather than Ray Data's
    ``map_batches``: a part is already the batch of work, and its file is the output."""
    import ray

    from training.components import embeddings as E
    from training.components import faiss_index as FI
    from training.components.search import check_index_settings, retriever_model_path

    rows = corpus_rows(cfg)
    encoder_path = retriever_model_path(cfg, cfg.index.use_finetuned)
    all_parts = E.parts(rows, cfg.index.part_rows)
    cpus, gpus = placement.bundle.get("CPU", 0), placement.bundle.get("GPU", 0)
    encode = remote_task(encode_part_task, gpus)
    with reserved(placement, cfg.ray.placement_timeout_s, f"{cfg.run_id}-index") as pg:
        t0 = time.monotonic()
        tree = cfg.to_dict()

        def where(i: int, fn: Any, g: float = 0) -> Any:
            return fn.options(num_cpus=cpus, num_gpus=g, max_retries=1, scheduling_strategy=strategy_for(pg, i))

        encoded = [where(p.n % placement.workers, encode, gpus).remote(tree, encoder_path, p.n, gpus, cpus)
                   for p in all_parts]
        ray.wait(encoded, num_returns=len(encoded))
        encode_s = time.monotonic() - t0
        train_sample = 0
        check_index_settings(cfg.index, rows, E.dimension(cfg.stage_dir("index") / E.PARTS_DIR))
        if cfg.index.kind in FI.SHARDED_KINDS:
            trained = where(0, ray.remote(train_index_task)).remote(tree, encoder_path, *encoded)
            added = [where(p.n % placement.workers, ray.remote(add_part_task)).remote(tree, p.n, trained)
                     for p in all_parts]
            train_sample = ray.get(trained)
            ray.get(added)
        return ray.get(where(0, remote_task(finish_index_task, 0)).remote(tree, encoder_path, encode_s, train_sample,
                                                                   *encoded))


def run_evaluate(cfg: RunConfig, placement: StagePlacement) -> dict[str, Any]:
    import ray

    cpus, gpus = placement.bundle.get("CPU", 0), placement.bundle.get("GPU", 0)
    with reserved(placement, cfg.ray.placement_timeout_s, f"{cfg.run_id}-evaluate") as pg:
        return ray.get(remote_task(evaluate_task, gpus).options(num_cpus=cpus, num_gpus=gpus, max_retries=0,
                                                         scheduling_strategy=strategy_for(pg, 0))
                       .remote(cfg.to_dict(), gpus, cpus))


def coordinate_stage(tree: dict[str, Any], stage: str, upstream: dict[str, Any] | None) -> dict[str, Any]:
    """Coordinator task of one stage: skip it when complete with these settings, else place it and run it
    (the stage's own code writes its outputs and its ``_COMPLETE`` marker).

    ``upstream`` is the previous stage's result (Ray resolves the ref before this runs); the
    return value adds this stage's summary to it.
    """
    from training.components.stage import completed

    cfg = load_run_config(tree)
    summaries = dict(upstream or {})
    t0 = time.monotonic()
    if stage != PREPARE and completed(cfg, stage):  # the pipeline's rule: marker + fingerprint
        summaries[stage] = {"skipped": "complete"}
        return summaries
    # Against the namespace's declared pools (RAGPOOL_RAY_POOLS) when set: on an idle cluster no node is alive,
    # and the stage's placement group is what makes Ray's autoscaler add one.
    placement = plan(stage, cfg.ray.stage(stage), _nodes())
    if stage == PREPARE:
        out = run_prepare(cfg, placement)
    elif stage in TRAINING_STAGES:
        out = run_training(cfg, stage, placement)
    elif stage == "index":
        out = run_index(cfg, placement)
    else:
        out = run_evaluate(cfg, placement)
    summaries[stage] = {**out, "placement": placement.describe(), "wall_seconds": round(time.monotonic() - t0, 2)}
    return summaries


def submit(cfg: RunConfig) -> Any:
    """Submit the whole stage chain; returns the last stage's object ref (all summaries)."""
    import ray

    coordinator = ray.remote(coordinate_stage)
    tree = cfg.to_dict()
    # The stage tasks (and the tasks and Ray Train workers they start) see this driver's variables
    # of _WORKER_ENV, whatever environment the cluster's processes were started with.
    runtime_env = {"env_vars": _worker_env()}
    ref = None
    for stage in (PREPARE, *cfg.stages):
        ref = coordinator.options(num_cpus=0, max_retries=0, name=f"{cfg.run_id}-{stage}",
                                  runtime_env=runtime_env).remote(tree, stage, ref)
    return ref


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run every stage of ``cfg`` on the connected Ray cluster; returns per-stage summaries.

    Raises the failing stage's error (``ConfigError``/``DataError`` for bad input,
    :class:`PlacementError` when a pool had no room, anything else for a failure).
    """
    import ray

    return ray.get(submit(cfg))


def _cause(err: BaseException) -> BaseException:
    """The user-level error inside Ray's wrappers (RayTaskError, TrainingFailedError)."""
    from training.components.data import DataError

    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        # RayTaskError(X) is itself an X (its str() Ray's traceback): look inside it first.
        inner = getattr(err, "cause", None)
        if isinstance(inner, BaseException):
            err = inner
            continue
        if isinstance(err, (ConfigError, PlacementError, StageFailed, DataError)):
            return err
        inner = err.__cause__
        if inner is None:
            # Ray Train V2's WorkerGroupError keeps per-worker errors.
            errors = getattr(err, "worker_failures", None) or {}
            inner = next(iter(errors.values()), None) if isinstance(errors, dict) else None
        if inner is None:
            return err
        err = inner
    return err


def exit_code_for(err: BaseException) -> int:
    from training.components.data import DataError

    cause = _cause(err)
    if isinstance(cause, (ConfigError, DataError)):
        return BAD_INPUT
    if isinstance(cause, PlacementError):
        return UNAVAILABLE
    if isinstance(cause, StageFailed):
        return cause.code if cause.code in (BAD_INPUT,) else FAILED
    return FAILED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        path, overrides = split_cli(argv)
        cfg = load_run_config(path, overrides)
    except ConfigError as err:
        print(f"{DRIVER_ERROR_PREFIX}config error: {err}", file=sys.stderr)
        return BAD_INPUT
    connect(cfg)
    try:
        summaries = run(cfg)
    except Exception as err:  # every failure ends as one line naming its cause, and an exit code
        code = exit_code_for(err)
        cause = _cause(err)
        if code == FAILED and not isinstance(cause, StageFailed):
            traceback.print_exception(err, file=sys.stderr)
        print(f"{DRIVER_ERROR_PREFIX}run {cfg.run_id} failed: {type(cause).__name__}: {cause}", file=sys.stderr)
        return code
    print(json.dumps({"stages": summaries}, indent=2, default=str))
    report = cfg.stage_dir("evaluate") / "report.json"
    if "evaluate" in cfg.stages and report.is_file():
        print(json.dumps(json.loads(report.read_text()), indent=2))
    print(f"artifacts: {cfg.run_dir()}")
    return OK


if __name__ == "__main__":
    sys.exit(main())
