"""Fault injection for the training tests, installed into the training loop as step hooks.

The tests run stages in torchrun subprocesses, so the hooks travel by environment:
:func:`tests.support.training.child_env` names this module in the loop's hooks variable
(:data:`training.components.loop.HOOKS_ENV`) whenever a fault variable below is set, and
the loop calls :func:`step_hooks` once per process. Nothing here is read by production code.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.components.loop import StepHook, Trainer

#: SIGKILL this process right after this optimizer step (once any checkpoint for an
#: earlier step has been fully written and every rank has reached the step).
RESUME_FAULT_ENV = "RAGPOOL_FAULT_KILL_AFTER_STEP"
#: Right after this optimizer step, hang (no more steps, metrics still served, as a
#: deadlocked run looks) until SIGTERM, which then stops the run as usual (checkpoint, 75).
HANG_FAULT_ENV = "RAGPOOL_FAULT_HANG_AFTER_STEP"
#: Only in this stage's training loop (``retriever`` or ``generator``); unset: in every stage's.
FAULT_STAGE_ENV = "RAGPOOL_FAULT_STAGE"
FAULT_ENVS = (RESUME_FAULT_ENV, HANG_FAULT_ENV, FAULT_STAGE_ENV)
#: This module, as the loop's hooks variable names it.
MODULE = __name__


def _in_stage(trainer: "Trainer") -> bool:
    stage = os.environ.get(FAULT_STAGE_ENV)
    return not stage or trainer.task.stage == stage


def kill_after(step: int) -> "StepHook":
    def hook(trainer: "Trainer") -> None:
        if trainer.step == step and _in_stage(trainer):
            trainer.ckpt.wait()
            from training.components import distributed as D

            D.barrier(trainer.env)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def hang_after(step: int) -> "StepHook":
    def hook(trainer: "Trainer") -> None:
        if trainer.step == step and _in_stage(trainer):
            trainer.log.warning("%s=%d: hanging until SIGTERM", HANG_FAULT_ENV, step)
            while not trainer.stop_requested:
                time.sleep(0.1)

    return hook


def step_hooks() -> list["StepHook"]:
    """The hooks the fault variables of this process's environment ask for."""
    hooks = []
    for name, make in ((RESUME_FAULT_ENV, kill_after), (HANG_FAULT_ENV, hang_after)):
        if os.environ.get(name):
            hooks.append(make(int(os.environ[name])))
    return hooks
