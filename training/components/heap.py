"""When Python's cyclic garbage collector runs in a stage process.

A rank's start (torch, transformers and the model's modules, the model itself) makes a few million
container objects that live as long as the stage. With the collector on, every full collection walks all
of them again and frees next to nothing: on the tiny retriever rank of the tests, 0.51 of its ~3.8
CPU-seconds (``bench/stage_gc.py``). So a stage process pauses the collector when it starts (:func:`pause`,
first thing in :func:`training.components.stage.run_main`); once the stage's setup is done (model built and
loaded, optimizer made) :func:`settle` moves every object into the permanent generation
(:func:`gc.freeze`) and turns the collector back on, so the loop's collections walk only what the loop
makes. :func:`release`, at the end of every :func:`training.components.stage.run_stage`, makes the frozen
objects collectable again: what one stage leaves in reference cycles (its trainer, model and optimizer,
the start's garbage) is freed before the next stage of a ``pipeline`` process runs, not kept for the life
of the process. :func:`restore` (the end of ``run_main``) is Python's default again. A Tune trial trains
without ``run_stage`` (``training/ray/tune.py``): its Ray Train worker, and what it froze, end with the trial.

torchtitan turns the automatic collector off for the whole of training and collects generation 1 every N
steps (``GarbageCollection``, torchtitan/tools/utils.py); this keeps it on in the loop and takes the cost
out of the start, where it is.
"""

from __future__ import annotations

import gc

__all__ = ["pause", "release", "restore", "settle"]


def pause() -> None:
    """No automatic collection until :func:`settle`: the start's objects are kept anyway."""
    gc.disable()


def settle() -> None:
    """Setup is over: freeze what exists (no collection: walking it is the cost), collect automatically again."""
    gc.freeze()
    gc.enable()


def release() -> None:
    """The stage is over: what :func:`settle` froze can be collected again (cycles included)."""
    gc.unfreeze()


def restore() -> None:
    """Python's default again: nothing frozen, automatic collection on."""
    gc.unfreeze()
    gc.enable()
