"""training.components.heap: a stage process collects nothing while it starts, freezes its setup, frees it
when the stage ends and leaves the collector as Python's default (what it saves: bench/stage_gc.py). The
Trainer's call: tests/training/components/test_loop.py."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from training.components import heap
from training.components.distributed import DistEnv
from training.components.stage import run_main, run_stage
from training.config.run import load_run_config
from contract.exit_codes import BAD_INPUT, OK

ENV = DistEnv(0, 1, 0, 1, torch.device("cpu"))


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _garbage_cycle() -> weakref.ref:
    """A reference cycle nothing else points to: only the cyclic collector can free it."""
    return weakref.ref(_Cycle())


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # init_distributed leaves this process's threads alone
    from training.components import logs

    monkeypatch.setattr(logs, "_CONTEXT", logs._CONTEXT)  # run_main sets the process's log context


def test_run_main_pauses_the_collector_for_the_stage_and_restores_it(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"shared_root: {tmp_path}\ndevice: cpu\n")
    seen = []

    def run(cfg, env) -> int:
        seen.append(gc.isenabled())
        heap.settle()  # as a stage's setup does
        return OK

    assert run_main("index", run, ["--config", str(config)]) == OK
    assert seen == [False]
    assert gc.isenabled() and gc.get_freeze_count() == 0
    # A config error returns before any stage runs, and leaves the collector as it was, too.
    assert run_main("index", run, ["--config", str(tmp_path / "missing.yaml")]) == BAD_INPUT
    assert seen == [False] and gc.isenabled()


def test_settle_freezes_without_collecting_and_release_makes_it_collectable() -> None:
    heap.pause()
    cycle = _garbage_cycle()
    heap.settle()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.collect()
    assert cycle() is not None, "a frozen cycle was collected: settle must not walk the start's objects"
    heap.release()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert cycle() is None, "release left the stage's cycles uncollectable"


def test_run_stage_releases_what_the_stage_froze_even_when_it_fails(tmp_path: Path) -> None:
    cfg = load_run_config({"shared_root": str(tmp_path)})
    cycles = []

    def body(cfg, env) -> int:
        cycles.append(_garbage_cycle())
        heap.settle()
        raise RuntimeError("the stage failed")

    heap.pause()
    with pytest.raises(RuntimeError):
        run_stage(cfg, ENV, "index", body)
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert cycles[0]() is None
