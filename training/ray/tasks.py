"""The bodies of the Ray tasks and Ray Train workers a run's stages start (training/ray/driver.py plans, places
and chains them; these run on the Ray workers).

- ``prepare``: :func:`validate_file`, one data file read and validated;
- ``index``: :func:`encode_part_task` (one corpus part encoded, the same files as a torchrun rank's), for ``ivfpq``
  :func:`train_index_task` and :func:`add_part_task`, then :func:`finish_index_task` (built or merged, marked);
- ``evaluate``: :func:`evaluate_task`, the evaluation stage's ``run()``;
- ``retriever`` / ``generator``: :func:`train_worker`, the stage's ``run()`` in Ray Train's process group.

A stage's ``run()`` that returns non-zero raises :class:`StageFailed`; :func:`remote_task` wraps a task body for
calls that set their resources per call.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

from contract.exit_codes import OK
from training.config.run import RunConfig, load_run_config


class StageFailed(RuntimeError):
    """A stage's own ``run()`` returned a non-zero exit code."""

    def __init__(self, stage: str, code: int) -> None:
        self.stage = stage
        self.code = code
        super().__init__(f"stage {stage} exited with code {code}")


def _task_env(device_cfg: str, gpus: float, cpus: float) -> Any:
    """A single-process DistEnv for a Ray task (torch threads bounded by the task's CPUs)."""
    import torch

    from training.components.distributed import DistEnv

    torch.set_num_threads(max(1, int(cpus or 1)))
    use_cuda = gpus > 0 and device_cfg != "cpu" and torch.cuda.is_available()
    return DistEnv(0, 1, 0, 1, torch.device("cuda", 0) if use_cuda else torch.device("cpu"))


def _log_context(cfg: RunConfig, rank: int):
    """The stage logs' run context for one task, as :func:`training.components.stage.run_main` sets it
    for a process (rank 0 keeps ``<stage>/log.jsonl``); scoped, so the worker process can be reused
    by the next task (of this run or another) without writing into this run's log."""
    from training.components import logs

    return logs.scoped_context(cfg.run_id, rank, cfg.run_dir())


def remote_task(fn: Any, gpus: float) -> Any:
    """``ray.remote(fn)`` for tasks whose resources are set per call (``.options``), with Ray's rule for
    GPU tasks that only applies when ``ray.remote`` itself is given GPUs: a GPU task's worker exits
    after it (its CUDA memory goes with it, ray-project/ray#29624); a CPU task's worker is reused,
    torch already imported."""
    import ray

    return ray.remote(max_calls=1 if gpus else 0)(fn)


def validate_file(shared_root: str, rel: str, kind: str, run_dir: str) -> dict[str, Any]:
    """Prepare task: read and validate one data file (the corpus prepared into the run's ``corpus/`` unless
    prepared in place, as :mod:`training.components.run_data` does); returns its record count."""
    from pathlib import Path

    from training.components.corpus import open_prepared
    from training.components.data import load_qa, resolve_confined
    from training.components.run_data import CORPUS_CACHE_DIR

    path = resolve_confined(shared_root, rel, f"data.{kind}")
    if kind == "corpus":
        return {"file": rel, "records": open_prepared(path, Path(run_dir) / CORPUS_CACHE_DIR).rows}
    return {"file": rel, "records": len(load_qa(path))}


def encode_part_task(tree: dict[str, Any], encoder_path: str, n: int, gpus: float, cpus: float) -> int:
    """Index task: part ``n`` of the corpus encoded to the index stage's ``embeddings/`` (the same files,
    checks and resume rule as a torchrun rank's: :func:`training.components.search.encode_my_parts`);
    1 when it encoded, 0 when the part was already there."""
    from training.components import embeddings as E
    from training.components.run_data import open_corpus
    from training.components.search import _encoder_batches

    cfg = load_run_config(tree)
    env = _task_env(cfg.device, gpus, cpus)
    corpus = open_corpus(cfg)
    part = E.parts(corpus.rows, cfg.index.part_rows)[n]
    emb_dir = cfg.stage_dir("index") / E.PARTS_DIR
    if not E.is_done(emb_dir, part, encoder_path):
        _, encode_batch = _encoder_batches(encoder_path, cfg.retriever.max_length, cfg.index.batch_size, env.device)
        E.encode_part(corpus, part, emb_dir, encode_batch, cfg.index.batch_size, encoder_path)
        return 1
    return 0


def train_index_task(tree: dict[str, Any], encoder_path: str, *encoded: int) -> int:
    """Index task (ivfpq): the empty index trained on a sample of the parts, once (kept across retries)."""
    from training.components import embeddings as E
    from training.components import faiss_index as FI

    from training.components.search import sharded_build_key

    cfg = load_run_config(tree)
    out = cfg.stage_dir("index")
    rows = corpus_rows(cfg)
    all_parts = E.parts(rows, cfg.index.part_rows)
    FI.reset_if_stale(out, sharded_build_key(cfg.index, encoder_path, rows))
    if not (out / FI.TRAINED_FILE).is_file():
        return FI.train(out, out / E.PARTS_DIR, all_parts, cfg.index, cfg.seed)
    return 0


def add_part_task(tree: dict[str, Any], n: int, train_sample: int) -> int:
    """Index task (ivfpq): part ``n``'s vectors added to a copy of the trained index, written alone."""
    from training.components import embeddings as E
    from training.components import faiss_index as FI

    cfg = load_run_config(tree)
    out = cfg.stage_dir("index")
    FI.add_part(out, out / E.PARTS_DIR, E.parts(corpus_rows(cfg), cfg.index.part_rows)[n])
    return n


def finish_index_task(tree: dict[str, Any], encoder_path: str, encode_s: float, train_sample: int,
                      *done: int) -> dict[str, Any]:
    """Index task: the parts built (small kinds) or merged (ivfpq) into the index stage's outputs, marked."""
    from training.components import embeddings as E
    from training.components import faiss_index as FI
    from training.components.logs import get_logger
    from training.components.search import finish_index, index_marker
    from training.components.stage import complete_stage

    cfg = load_run_config(tree)
    out = cfg.stage_dir("index")
    rows = corpus_rows(cfg)
    all_parts = E.parts(rows, cfg.index.part_rows)
    dim = E.dimension(out / E.PARTS_DIR)
    if cfg.index.kind in FI.SHARDED_KINDS:
        FI.merge(out, all_parts, cfg.index.nprobe)
    else:
        FI.build_small(out, out / E.PARTS_DIR, all_parts, cfg.index, cfg.seed)
    summary = {**index_marker(cfg.index, encoder_path, cfg.retriever.max_length, rows, dim, encode_s),
               "parts": len(all_parts), "parts_encoded": sum(done), "parts_resumed": len(done) - sum(done),
               "index_bytes": FI.index_bytes(out),
               **({"train_sample": train_sample} if train_sample else {})}
    with _log_context(cfg, 0):
        get_logger("index", True).info("indexed %d passages (%s, dim %d) from %d Ray task parts in %.1fs -> %s",
                                       rows, cfg.index.kind, dim, len(all_parts), encode_s, out)
        complete_stage(cfg, "index", summary)
    finish_index(out)
    return summary


def corpus_rows(cfg: RunConfig) -> int:
    from training.components.run_data import open_corpus

    return open_corpus(cfg).rows


def evaluate_task(tree: dict[str, Any], gpus: float, cpus: float) -> dict[str, Any]:
    """Evaluate task: the evaluation stage's ``run()`` in one process."""
    from training import evaluate

    cfg = load_run_config(tree)
    with _log_context(cfg, 0):
        code = evaluate.run(cfg, _task_env(cfg.device, gpus, cpus))
    if code != OK:
        raise StageFailed("evaluate", code)
    return {"report": str(cfg.stage_dir("evaluate") / evaluate.REPORT)}


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train worker: the stage's own ``run()`` in the process group Ray Train initialised.

    Ray Train sets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE and the torch process group
    (gloo on CPU, NCCL on GPU) before this runs; :func:`init_distributed` reads them and finds the
    group already initialised. The stage resumes from its own newest verified checkpoint.
    """
    import dataclasses

    import ray.train

    from training.components import distributed as D
    from training.components.loop import RUNTIME_HOOKS
    from training.elastic.sizes import NodeRange
    from training.ray import notice

    cfg = load_run_config(config["cfg"])
    stage = config["stage"]
    env = D.init_distributed(cfg.device)
    if NodeRange.from_env(os.environ) is not None:
        # An elastic stage's range counts Ray workers, each one rank wherever Ray placed it: one rank per unit of
        # the range on every rank (Ray's LOCAL_WORLD_SIZE differs between nodes of one group, and the batch
        # split, training/elastic/sizes.py, must be the same on all).
        env = dataclasses.replace(env, local_world_size=1)
    t0 = time.monotonic()
    # A spot notice (the node drained as preempted by its pod's preStop): checkpoint, then wait for the node to go.
    hooks = RUNTIME_HOOKS.set(tuple(notice.step_hooks()))
    try:
        with _log_context(cfg, env.rank):
            code = importlib.import_module(f"training.{stage}").run(cfg, env)
    finally:
        RUNTIME_HOOKS.reset(hooks)
    ray.train.report({"stage": stage, "exit_code": code, "seconds": time.monotonic() - t0,
                      "world_size": env.world_size})
    if code != OK:
        raise StageFailed(stage, code)
