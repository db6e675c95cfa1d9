"""The shared training loop: DDP, accumulation, clipping, AdamW + warmup/cosine, resumable
data order, checkpoints (periodic in the background, final and on SIGTERM), metrics, logs.

A stage supplies a :class:`TrainTask`: how to build a micro-batch from example indices,
how many loss units it holds (questions or answer tokens), and how to compute the summed
loss. The loop normalises by the *global* count, so N ranks compute the same update as
one process on the same global batch.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.components import distributed as D
from training.components.stage import PREEMPTED_MARKER, write_json_atomic
from training.components.checkpoint import Checkpointer
from training.config import CheckpointConfig, OptimConfig, RunConfig
from training.components.data import ResumableOrder
from training.exit_codes import OK, RETRIABLE
from training.components.logs import Progress, get_logger
from training.components.metrics import process_metrics
from training.components.optim import build_optimizer, build_scheduler

# Fault injection for tests: environment variables only, never read from a run spec.
#: SIGKILL this process right after this optimizer step (once any checkpoint for an
#: earlier step has been fully written).
FAULT_KILL_ENV = "RAGPOOL_FAULT_KILL_AFTER_STEP"
#: Right after this optimizer step, hang (no more steps, metrics still served, as a
#: deadlocked run looks) until SIGTERM, which then stops the run as usual (checkpoint, 75).
FAULT_HANG_ENV = "RAGPOOL_FAULT_HANG_AFTER_STEP"


@dataclass
class TrainTask:
    stage: str
    """Stage name (metrics label, log name, checkpoint dir)."""
    model: torch.nn.Module
    """The model to train (unwrapped; the loop moves it and wraps it in DDP)."""
    n_examples: int
    """Size of the training set the indices refer to."""
    global_batch_size: int
    """Examples per optimizer step over all ranks and micro-steps."""
    grad_accum: int
    """Micro-steps per optimizer step."""
    max_steps: int
    """Optimizer steps to run in total."""
    optim: OptimConfig
    """Optimizer and schedule settings."""
    make_batch: Callable[[list[int]], Any]
    """Example indices -> micro-batch (tensors on CPU)."""
    count: Callable[[Any], int]
    """Loss units in a micro-batch (questions, answer tokens)."""
    loss_sum: Callable[[torch.nn.Module, Any, torch.device], torch.Tensor]
    """(wrapped model, micro-batch, device) -> summed (not averaged) loss of this rank's micro-batch."""
    tokens: Callable[[Any], int] = lambda batch: 0
    """Input tokens in a micro-batch (for tokens/s)."""


@dataclass
class TrainResult:
    exit_code: int
    """OK, or RETRIABLE when stopped by SIGTERM after checkpointing."""
    step: int
    """Optimizer steps completed."""
    losses: list[float] = field(default_factory=list)
    """Global mean loss of each step run in this process."""
    resumed_from: int | None = None
    """Step of the checkpoint training resumed from, if any."""


class _StopFlag:
    """SIGTERM/SIGINT → stop at the next step boundary (never inside a step)."""

    def __init__(self) -> None:
        self.requested = 0
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM,):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. embedded use): no handler
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = 1

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def rng_state() -> dict[str, Any]:
    """This process's RNG states as plain Python values (picklable for all_gather_object,
    loadable with ``weights_only=True``)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    random.setstate(_to_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), *n[2:]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _to_tuple(x: Any) -> Any:
    return tuple(_to_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def train(task: TrainTask, cfg: RunConfig, env: D.DistEnv, stage_dir: Path) -> TrainResult:
    """Run (or resume) ``task`` to ``max_steps``; checkpoints go to ``stage_dir/checkpoints``."""
    log = get_logger(task.stage, env.is_main)
    ckcfg: CheckpointConfig = cfg.checkpoint
    per_rank_micro, rem = divmod(task.global_batch_size, env.world_size * task.grad_accum)
    if rem or per_rank_micro == 0:
        raise ValueError(f"{task.stage}.global_batch_size={task.global_batch_size}: must be a positive multiple of "
                         f"world_size*grad_accum={env.world_size}*{task.grad_accum}")
    metrics = process_metrics()
    metrics.serve(cfg.metrics.port, cfg.metrics.addr, env.local_rank)
    stage_metrics = metrics.for_stage(cfg.run_id, task.stage, env.rank)

    model = task.model.to(env.device)
    model.train()
    optimizer = build_optimizer(model, task.optim)
    scheduler = build_scheduler(optimizer, task.optim, task.max_steps)
    order = ResumableOrder(task.n_examples, task.global_batch_size, cfg.seed)
    ckpt = Checkpointer(stage_dir / "checkpoints", ckcfg.keep_latest_k, env.is_main,
                        on_saved=lambda step, secs: stage_metrics.checkpoint(secs))
    # Dropout differs per rank but is reproducible per (seed, rank).
    seed_everything(cfg.seed + 1000 * env.rank)

    start_step, resumed_from = 0, None
    if ckcfg.resume:
        chosen = None
        if env.is_main:
            ckpt.clean_temp()
            found = ckpt.latest()
            chosen = found[0] if found else None
        chosen = D.broadcast_object(env, chosen)
        if chosen is not None:
            from training.components.checkpoint import load_checkpoint_dir, step_dir_name

            states = found[1] if env.is_main else load_checkpoint_dir(ckpt.root / step_dir_name(chosen))  # type: ignore[index]
            model.load_state_dict(states["model"])
            optimizer.load_state_dict(states["optimizer"])
            scheduler.load_state_dict(states["scheduler"])
            trainer = states["trainer"]
            start_step = int(trainer["step"])
            rngs = trainer["rng"]
            set_rng_state(rngs[env.rank] if env.rank < len(rngs) else rngs[0])
            resumed_from = start_step
            log.info("resumed from %s at step %d (data position %s)", ckpt.root / step_dir_name(chosen),
                     start_step, trainer["data_position"])
    if env.is_main:
        (stage_dir / PREEMPTED_MARKER).unlink(missing_ok=True)  # this attempt supersedes it
    if start_step >= task.max_steps:
        log.info("already at step %d of %d", start_step, task.max_steps)
        return TrainResult(OK, start_step, [], resumed_from)

    wrapped = D.wrap_ddp(model, env, cfg.distributed.grad_compression, cfg.distributed.bucket_cap_mb,
                         cfg.distributed.sparse_embedding_grads)

    def state_for(step: int) -> dict[str, Any]:
        rngs = D.all_gather_object(env, rng_state())  # collective: every rank calls it
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "trainer": {"step": step, "data_position": order.position(step), "rng": rngs,
                            "world_size": env.world_size, "global_batch_size": task.global_batch_size}}

    def save(step: int, blocking: bool) -> None:
        state = state_for(step)
        if env.is_main:
            ckpt.save(step, state, blocking=blocking)

    stop = _StopFlag()
    stop.install()
    kill_after = int(os.environ.get(FAULT_KILL_ENV, "-1"))
    hang_after = int(os.environ.get(FAULT_HANG_ENV, "-1"))
    progress = Progress(log, task.max_steps, cfg.metrics.log_every, env.is_main, start=start_step)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if env.device.type == "cuda"
                else contextlib.nullcontext())
    losses: list[float] = []
    step = start_step
    try:
        while step < task.max_steps:
            t0 = time.monotonic()
            idx = order.rank_batch_indices(step, env.rank, env.world_size)
            micro = [task.make_batch(idx[i * per_rank_micro:(i + 1) * per_rank_micro])
                     for i in range(task.grad_accum)]
            local_count = sum(task.count(b) for b in micro)
            counts = torch.tensor([float(local_count)], dtype=torch.float64, device=env.device)
            if env.distributed:
                torch.distributed.all_reduce(counts)
            # loss_i * world / global_count: DDP's gradient mean then equals the global mean.
            scale = env.world_size / max(1.0, float(counts.item()))
            loss_acc = torch.zeros((), dtype=torch.float64, device=env.device)
            n_tokens = 0
            for i, batch in enumerate(micro):
                sync = i == len(micro) - 1
                ctx = wrapped.no_sync() if (env.distributed and not sync) else contextlib.nullcontext()
                with ctx:
                    with autocast:
                        loss = task.loss_sum(wrapped, batch, env.device) * scale
                    loss.backward()
                loss_acc += loss.detach().double()
                n_tokens += task.tokens(batch)
            if task.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), task.optim.grad_clip)
            if env.is_main:
                ckpt.wait_snapshot()  # a background save must have copied the weights first
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            # One collective per step carries the loss for logging and the stop request.
            summary = torch.stack([loss_acc, torch.tensor(float(stop.requested), dtype=torch.float64,
                                                          device=env.device)])
            if env.distributed:
                torch.distributed.all_reduce(summary)
            global_loss = float(summary[0].item()) / env.world_size
            stop_now = summary[1].item() > 0
            losses.append(global_loss)
            dt = time.monotonic() - t0
            stage_metrics.step(global_loss, dt, per_rank_micro * task.grad_accum, n_tokens)
            progress.update(step, loss=global_loss, lr=scheduler.get_last_lr()[0])
            if stop_now:
                log.warning("SIGTERM: checkpointing at step %d and exiting with %d (retriable)", step, RETRIABLE)
                save(step, blocking=True)
                if env.is_main:
                    # torchrun turns any child exit code into 1, so a launcher that must tell
                    # "preempted, resumable" from "failed" can read this marker instead.
                    write_json_atomic(stage_dir / PREEMPTED_MARKER,
                                      {"step": step, "exit_code": RETRIABLE, "at": time.time(),
                                       "checkpoint": str(ckpt.root / f"step_{step:06d}")})
                D.barrier(env)
                return TrainResult(RETRIABLE, step, losses, resumed_from)
            if ckcfg.every_steps and step % ckcfg.every_steps == 0 and step < task.max_steps:
                save(step, blocking=not ckcfg.async_save)
            if kill_after == step:
                ckpt.wait()
                D.barrier(env)
                os.kill(os.getpid(), signal.SIGKILL)
            if hang_after == step:
                log.warning("%s=%d: hanging until SIGTERM", FAULT_HANG_ENV, step)
                while not stop.requested:
                    time.sleep(0.1)
        save(step, blocking=True)
        D.barrier(env)
        stage_metrics.close()
    finally:
        stop.restore()
        if env.is_main:
            try:
                ckpt.wait()
            except Exception as err:  # don't mask the original exception
                log.error("background checkpoint failed: %s", err)
    return TrainResult(OK, step, losses, resumed_from)
