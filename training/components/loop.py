"""The shared training loop: DDP, accumulation, clipping, AdamW + warmup/cosine, resumable
data order, checkpoints (periodic in the background, final and on SIGTERM), metrics, logs.

A stage supplies a :class:`TrainTask`: how to build a micro-batch from example indices,
how many loss units it holds (questions or answer tokens), and how to compute the summed
loss. The loop normalises by the *global* count, so N ranks compute the same update as
one process on the same global batch.

:class:`Trainer` holds the state; :meth:`Trainer.train` is a short loop over
:meth:`Trainer._train_step`, with :meth:`Trainer.resume` before it and
:meth:`Trainer._stop_and_checkpoint` when SIGTERM arrives. Step hooks (``hooks=`` or the
modules named in :data:`HOOKS_ENV`) run after every optimizer step.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.components import distributed as D
from training.components import heap
from training.components import sharding as S
from training.components.checkpoint import Checkpointer
from training.components.checkpoint_dirs import checkpoint_format, load_checkpoint_dir, step_dir_name
from training.components.data import ResumableOrder
from training.components.dcp import load_dcp_state, newest_verified
from training.components.logs import Progress, get_logger
from training.components.metrics import process_metrics
from training.components.optim import build_optimizer, build_scheduler
from training.components.stage import PREEMPTED_MARKER, write_json_atomic
from training.config.run import RunConfig
from training.config.sections import ConfigError, OptimConfig, ParallelismConfig
from contract.exit_codes import OK, RETRIABLE

#: Comma-separated importable modules, each with ``step_hooks() -> list[StepHook]``, whose
#: hooks every :class:`Trainer` built without ``hooks=`` installs. Tests set it to reach
#: stages run in torchrun subprocesses (``tests.support.faults``); runs leave it unset.
HOOKS_ENV = "RAGPOOL_TEST_HOOKS"

StepHook = Callable[["Trainer"], None]
"""Called on every rank after each optimizer step (``trainer.step`` is the step just done,
``trainer.losses[-1]`` its global loss) once any periodic checkpoint has been started."""
RUNTIME_HOOKS: ContextVar[tuple[StepHook, ...]] = ContextVar("ragpool_runtime_hooks", default=())
"""Step hooks the executor adds to every :class:`Trainer` built in its context, before any others: a Ray Train
worker's preemption notice (training/ray/notice.py, set by training/ray/tasks.py ``train_worker``)."""


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
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    """DDP, or FSDP2/HSDP sharding per decoder block (:mod:`training.components.sharding`), and
    activation checkpointing; sharded runs checkpoint with DCP."""
    load_weights: Callable[[torch.nn.Module, torch.device], None] | None = None
    """For a ``model`` built with meta parameters: allocates the (sharded) model on the device and fills
    this rank's slices (:func:`training.components.sharding.load_safetensors_sharded`)."""


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

    def summary(self, prefix: str = "") -> dict[str, Any]:
        """A stage marker's training fields: steps, resumed_from, and ``<prefix>loss_first`` /
        ``<prefix>loss_last``, the mean loss of the first and last 5 steps run here (None if none)."""
        first, last = self.losses[:5], self.losses[-5:]
        return {"steps": self.step, "resumed_from": self.resumed_from,
                f"{prefix}loss_first": sum(first) / len(first) if first else None,
                f"{prefix}loss_last": sum(last) / len(last) if last else None}


class _StopFlag:
    """SIGTERM → stop at the next step boundary (never inside a step)."""

    def __init__(self) -> None:
        self.requested = 0
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        try:
            self._old[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
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


def hooks_from_env(environ: dict[str, str] | None = None) -> list[StepHook]:
    """The step hooks of the modules named in :data:`HOOKS_ENV` (none when it is unset)."""
    names = (os.environ if environ is None else environ).get(HOOKS_ENV, "")
    hooks: list[StepHook] = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            raise RuntimeError(f"{HOOKS_ENV}={names!r}: cannot import {name!r} ({err})") from err
        factory = getattr(module, "step_hooks", None)
        if not callable(factory):
            raise RuntimeError(f"{HOOKS_ENV}={names!r}: module {name!r} has no step_hooks() function")
        hooks.extend(factory())
    return hooks


class Trainer:
    """One stage's training state on this rank: model, optimizer, schedule, data order,
    checkpointer, metrics, and the step reached."""

    def __init__(self, task: TrainTask, cfg: RunConfig, env: D.DistEnv, stage_dir: Path,
                 hooks: Sequence[StepHook] | None = None) -> None:
        self.task, self.cfg, self.env, self.stage_dir = task, cfg, env, stage_dir
        self.log = get_logger(task.stage, env.is_main)
        self.per_rank_micro, self.grad_accum = _batch_split(task, env)
        self.hooks: list[StepHook] = [*RUNTIME_HOOKS.get(), *(hooks_from_env() if hooks is None else hooks)]
        metrics = process_metrics()
        metrics.serve(cfg.metrics.port, cfg.metrics.addr, env.local_rank)
        self.metrics = metrics.for_stage(cfg.run_id, task.stage, env.rank)
        self.metrics.world(env.world_size, _min_world(env))
        self.par = task.parallelism
        # Sharding comes before the optimizer: AdamW must hold (and size its state by) the shards.
        # A model built on the meta device is sharded first and only then allocated and loaded.
        on_meta = any(p.is_meta for p in task.model.parameters())
        if on_meta and task.load_weights is None:
            raise ValueError(f"{task.stage}: the model has meta parameters but the task has no load_weights")
        self.model = S.shard_model(task.model if on_meta else task.model.to(env.device), self.par, env, task.stage)
        if on_meta:
            task.load_weights(self.model, env.device)  # type: ignore[misc]
        self.sharded = S.is_sharded(self.model)
        self.model.train()
        self.wrapped: torch.nn.Module = self.model
        self.optimizer = build_optimizer(self.model, task.optim)
        self.scheduler = build_scheduler(self.optimizer, task.optim, task.max_steps)
        self.order = ResumableOrder(task.n_examples, task.global_batch_size, cfg.seed)
        self.ckpt = Checkpointer(stage_dir / "checkpoints", cfg.checkpoint.keep_latest_k, env.is_main,
                                 on_saved=lambda step, secs: self.metrics.checkpoint(secs))
        # Dropout differs per rank but is reproducible per (seed, rank).
        seed_everything(cfg.seed + 1000 * env.rank)
        self.step = 0
        self.resumed_from: int | None = None
        self.losses: list[float] = []
        self.stop = _StopFlag()
        self._autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if env.device.type == "cuda"
                          else contextlib.nullcontext())
        heap.settle()  # setup done: the loop's collections need not walk the start's objects again

    @property
    def stop_requested(self) -> bool:
        """SIGTERM reached this rank (the ranks agree on it at the next step's end)."""
        return bool(self.stop.requested)

    def train(self) -> TrainResult:
        """Run (or resume) the task to ``max_steps``."""
        task, env = self.task, self.env
        if self.cfg.checkpoint.resume:
            self.resume()
        if env.is_main:
            (self.stage_dir / PREEMPTED_MARKER).unlink(missing_ok=True)  # this attempt supersedes it
        if self.step >= task.max_steps:
            self.log.info("already at step %d of %d", self.step, task.max_steps)
            return self._result(OK)
        if not self.par.sharded:
            dc = self.cfg.distributed
            self.wrapped = D.wrap_ddp(self.model, env, dc.grad_compression, dc.bucket_cap_mb,
                                      dc.sparse_embedding_grads)
        self.progress = Progress(self.log, task.max_steps, self.cfg.metrics.log_every, env.is_main, start=self.step)
        self.stop.install()
        try:
            while self.step < task.max_steps:
                if self._train_step():
                    return self._stop_and_checkpoint()
                self._periodic_save()
                if self.hooks:
                    self._run_hooks()
            self.save(blocking=True)
            D.barrier(env)
            self.metrics.close()
        finally:
            self.stop.restore()
            try:  # every rank: a background DCP save's commit is a collective of them all
                self.ckpt.wait()
            except Exception as err:  # don't mask the original exception
                self.log.error("background checkpoint failed: %s", err)
        return self._result(OK)

    def resume(self) -> None:
        """Load the newest complete checkpoint (rank 0 chooses it for every rank; sharded runs verify
        it together, each rank reading a share of its files), if any."""
        env = self.env
        found = None
        if env.is_main:
            self.ckpt.clean_temp()
        if self.sharded:
            D.barrier(env)  # the temp dirs are gone before any rank lists
            step = newest_verified(self.ckpt.root, env)
            chosen = None if step is None else (step, checkpoint_format(self.ckpt.root / step_dir_name(step)))
        else:
            if env.is_main:
                found = self.ckpt.latest()
            chosen = D.broadcast_object(env, (found[0], checkpoint_format(self.ckpt.root / step_dir_name(found[0])))
                                        if found else None)
        if chosen is None:
            return
        path = self.ckpt.root / step_dir_name(chosen[0])
        states = found[1] if found else load_checkpoint_dir(path)
        if chosen[1] == "dcp":  # sharded: each rank reads its slices, whatever world size wrote them
            load_dcp_state(path, self.model, self.optimizer)
        elif self.sharded:
            raise ConfigError(f"parallelism.strategy={self.par.strategy!r}: checkpoint {path} was written "
                              "unsharded (ddp); finish the stage with ddp or delete its checkpoints",
                              "parallelism.strategy")
        else:
            self.model.load_state_dict(states["model"])
            self.optimizer.load_state_dict(states["optimizer"])
        self.scheduler.load_state_dict(states["scheduler"])
        trainer = states["trainer"]
        self.step = self.resumed_from = int(trainer["step"])
        saved_world = int(trainer.get("world_size", env.world_size))
        if saved_world != env.world_size:
            self.log.warning("world size changed: %d -> %d ranks at step %d (global batch %d kept: %d "
                             "micro-steps of %d per rank)", saved_world, env.world_size, self.step,
                             self.task.global_batch_size, self.grad_accum, self.per_rank_micro)
            if env.is_main:
                self._mark_resize(saved_world)
        rngs = trainer["rng"]
        set_rng_state(rngs[env.rank] if env.rank < len(rngs) else rngs[0])
        self.log.info("resumed from %s at step %d (data position %s)", path, self.step, trainer["data_position"])

    def _mark_resize(self, saved_world: int) -> None:
        """Rank 0: the resize mark of this resume (:mod:`training.elastic.resizes`; before :meth:`train` removes
        the preempted marker its cause reads)."""
        from training.elastic import resizes

        try:
            preempted = json.loads((self.stage_dir / PREEMPTED_MARKER).read_text()).get("step")
        except (OSError, ValueError, AttributeError):  # none, or not a marker of ours
            preempted = None
        cause = resizes.cause(saved_world, self.env.world_size, preempted, self.step)
        resizes.append(self.stage_dir, resizes.mark(self.step, saved_world, self.env.world_size,
                                                    self.env.local_world_size, cause, time.time()))

    def _train_step(self) -> bool:
        """One optimizer step over ``grad_accum`` micro-batches; True when any rank got SIGTERM."""
        task, env = self.task, self.env
        t0 = time.monotonic()
        n = self.per_rank_micro
        idx = self.order.rank_batch_indices(self.step, env.rank, env.world_size)
        micro = [task.make_batch(idx[i * n:(i + 1) * n]) for i in range(self.grad_accum)]
        counts = torch.tensor([float(sum(task.count(b) for b in micro))], dtype=torch.float64, device=env.device)
        if env.distributed:
            torch.distributed.all_reduce(counts)
        # loss_i * world / global_count: DDP's gradient mean then equals the global mean.
        scale = env.world_size / max(1.0, float(counts.item()))
        loss_acc = torch.zeros((), dtype=torch.float64, device=env.device)
        n_tokens = 0
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1
            if self.sharded:  # FSDP2 reduce-scatters on the last micro-step only, as DDP all-reduces
                S.set_gradient_sync(self.model, last)
            with self.wrapped.no_sync() if (env.distributed and not last and not self.sharded) \
                    else contextlib.nullcontext():
                with self._autocast:
                    loss = task.loss_sum(self.wrapped, batch, env.device) * scale
                loss.backward()
            loss_acc += loss.detach().double()
            n_tokens += task.tokens(batch)
        if task.optim.grad_clip > 0:
            # On DTensor shards the norm is reduced over the ranks: the same global norm as DDP's.
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), task.optim.grad_clip)
        self.ckpt.wait_snapshot()  # a background save must have copied the weights first (no-op without one)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        # One collective per step carries the loss for logging and the stop request.
        summary = torch.stack([loss_acc, torch.tensor(float(self.stop.requested), dtype=torch.float64,
                                                      device=env.device)])
        if env.distributed:
            torch.distributed.all_reduce(summary)
        global_loss = float(summary[0].item()) / env.world_size
        self.losses.append(global_loss)
        self.metrics.step(global_loss, time.monotonic() - t0, n * self.grad_accum, n_tokens)
        # The nodes this step ran on (an elastic run's current size: `ragpool status`, training/reports/progress.py).
        self.progress.update(self.step, loss=global_loss, lr=self.scheduler.get_last_lr()[0],
                             nodes=env.world_size // max(1, env.local_world_size))
        return summary[1].item() > 0

    def _periodic_save(self) -> None:
        """Every ``checkpoint.every_steps`` (in the background with ``async_save``, DCP or ``.pt``);
        the last step is saved by :meth:`train` itself."""
        every = self.cfg.checkpoint.every_steps
        if every and self.step % every == 0 and self.step < self.task.max_steps:
            self.save(blocking=not self.cfg.checkpoint.async_save)

    def _run_hooks(self) -> None:
        for hook in self.hooks:
            hook(self)

    def _stop_and_checkpoint(self) -> TrainResult:
        """SIGTERM: checkpoint this step, leave the preempted marker, exit retriable."""
        self.log.warning("SIGTERM: checkpointing at step %d and exiting with %d (retriable)", self.step, RETRIABLE)
        self.save(blocking=True)
        self.mark_preempted()
        D.barrier(self.env)
        return self._result(RETRIABLE)

    def mark_preempted(self) -> None:
        """Rank 0 leaves the stage's preempted marker for the step just saved: torchrun turns any child exit code
        into 1, so a launcher that must tell "preempted, resumable" from "failed" reads it, and the next attempt's
        resume marks its resize as a notice (:meth:`_mark_resize`)."""
        if self.env.is_main:
            write_json_atomic(self.stage_dir / PREEMPTED_MARKER,
                              {"step": self.step, "exit_code": RETRIABLE, "at": time.time(),
                               "checkpoint": str(self.ckpt.root / step_dir_name(self.step))})

    def save(self, blocking: bool) -> None:
        """Checkpoint the current step (a collective: every rank calls it; rank 0 writes)."""
        rngs = D.all_gather_object(self.env, rng_state())
        state = {"scheduler": self.scheduler.state_dict(),
                 "trainer": {"step": self.step, "data_position": self.order.position(self.step), "rng": rngs,
                             "world_size": self.env.world_size,
                             "global_batch_size": self.task.global_batch_size}}
        if self.par.sharded:  # every rank writes its shards, rank 0 the rest
            self.ckpt.save_dcp(self.step, self.model, self.optimizer, state, self.env, blocking=blocking)
            return
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **state}
        if self.env.is_main:
            self.ckpt.save(self.step, state, blocking=blocking)

    def _result(self, exit_code: int) -> TrainResult:
        return TrainResult(exit_code, self.step, self.losses, self.resumed_from)


def _min_world(env: D.DistEnv) -> int | None:
    """The fewest ranks an elastic run trains on (nodes.min x ranks per node); None for a fixed-size run. After
    :func:`_batch_split`, which refused a malformed range."""
    from training.elastic.sizes import NodeRange

    nodes = NodeRange.from_env(os.environ)
    return None if nodes is None else nodes.min * env.local_world_size


def _batch_split(task: TrainTask, env: D.DistEnv) -> tuple[int, int]:
    """(examples per rank and micro-step, micro-steps per optimizer step) at this world size. A fixed-size run:
    the stage's ``grad_accum``. An elastic one (the launcher's :data:`contract.env.ELASTIC_NODES_ENV`): the
    micro-batch of the largest world, accumulated as often as this world needs to keep the global batch
    (:mod:`training.elastic.sizes`)."""
    from training.elastic.sizes import ElasticError, NodeRange, accumulation, micro_batch

    key = f"{task.stage}.global_batch_size"
    nodes = None
    try:
        nodes = NodeRange.from_env(os.environ)
        if nodes is not None:
            micro = micro_batch(task.global_batch_size, task.grad_accum, nodes.max * env.local_world_size)
            return micro, accumulation(task.global_batch_size, env.world_size, micro)
    except ElasticError as err:
        raise ConfigError(f"{key}: {err} (nodes {nodes.to_env() if nodes else '?'}, "
                          f"{env.local_world_size} rank(s) per node)", key) from None
    micro, rem = divmod(task.global_batch_size, env.world_size * task.grad_accum)
    if rem or micro == 0:
        raise ValueError(f"{key}={task.global_batch_size}: must be a positive "
                         f"multiple of world_size*grad_accum={env.world_size}*{task.grad_accum}")
    return micro, task.grad_accum


def train(task: TrainTask, cfg: RunConfig, env: D.DistEnv, stage_dir: Path,
          hooks: Sequence[StepHook] | None = None) -> TrainResult:
    """Run (or resume) ``task`` to ``max_steps``; checkpoints go to ``stage_dir/checkpoints``."""
    return Trainer(task, cfg, env, stage_dir, hooks).train()
