"""Expensive test inputs made once per test run, not once per xdist worker."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def once_per_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str,
                 build: Callable[[Path], object]) -> Path:
    """The directory ``name``, filled by ``build(directory)`` once per run, for session fixtures several xdist
    workers need. Under xdist it lives in the run's directory, which every worker shares: the first worker to ask
    builds it under a file lock while the others wait, then all read it. ``name.done`` beside it records a finished
    build, so a build that failed is redone (and fails again, in each worker that asks). Outside xdist: a fresh
    directory. Never write under it: copy what a test changes."""
    if worker_id == "master":
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    from filelock import FileLock

    out = tmp_path_factory.getbasetemp().parent / name
    done = out.with_name(f"{name}.done")
    with FileLock(f"{out}.lock"):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out
