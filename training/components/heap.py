"""When Python's cyclic garbage collector runs in a stage process.

A rank's start (torch, transformers and the model's modules, the model itself) makes a few million
container objects that live as long as the stage. With the collector on, every full collection walks all
of them again and frees next to nothing: on the tiny retriever rank of the tests, 0.56 of its ~4 CPU-seconds
(``bench/stage_gc.py``). So a stage process pauses the collector when it starts (:func:`pause`, first
thing in :func:`training.components.stage.run_main`); once the stage's setup is done (model built and
loaded, optimizer made) :func:`settle` moves every object into the permanent generation
(:func:`gc.freeze`) and turns the collector back on, so the loop's collections walk only what the loop
makes. :func:`release`, at the end of every :func:`training.components.stage.run_stage`, makes the frozen
objects collectable again: what one stage leaves in reference cycles (its trainer, model and optimizer,
the start's garbage) is freed before the next stage of a ``pipeline`` process runs, not kept for the life
of the process. :func:`restore` (the end of ``run_main``) is Python's default again.

The same idea as torchtitan's ``GarbageCollection`` (automatic collection off in training), moved to
where the cost is: the start. CPython documents :func:`gc.freeze` for this use.
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
