"""training.components.stage: the one completion prologue every stage runs through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.components.distributed import DistEnv
from training.components.stage import (COMPLETE_MARKER, FINGERPRINT_KEY, complete_stage, completed, run_stage,
                                       stage_fingerprint)
from training.config import ConfigError, load_run_config
from training.exit_codes import OK, RETRIABLE

ENV = DistEnv(0, 1, 0, 1, torch.device("cpu"))


def _cfg(root: Path, *overrides: str):
    return load_run_config({"shared_root": str(root)}, list(overrides))


def _body(calls: list[str], code: int = OK):
    def body(cfg, env) -> int:
        calls.append("ran")
        if code == OK:
            complete_stage(cfg, "index", {"passages": 3})
        return code

    return body


def test_runs_then_skips_when_complete_with_the_same_settings(tmp_path: Path) -> None:
    cfg, calls = _cfg(tmp_path), []
    assert run_stage(cfg, ENV, "index", _body(calls)) == OK
    marker = json.loads((cfg.stage_dir("index") / COMPLETE_MARKER).read_text())
    assert marker["stage"] == "index" and marker["passages"] == 3
    assert marker[FINGERPRINT_KEY] == stage_fingerprint(cfg, "index")
    assert completed(cfg, "index")
    assert run_stage(cfg, ENV, "index", _body(calls)) == OK
    assert calls == ["ran"]


def test_completed_with_other_settings_is_refused(tmp_path: Path) -> None:
    calls: list[str] = []
    run_stage(_cfg(tmp_path), ENV, "index", _body(calls))
    other = _cfg(tmp_path, "--index.kind=hnsw")
    with pytest.raises(ConfigError, match="stage index of run local was completed with other settings"):
        run_stage(other, ENV, "index", _body(calls))
    assert calls == ["ran"]
    # Downstream sections do not shape an upstream stage's output.
    assert completed(_cfg(tmp_path, "--generator.max_steps=7"), "index")


def test_marker_without_fingerprint_counts_as_complete(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    (cfg.stage_dir("index")).mkdir(parents=True)
    (cfg.stage_dir("index") / COMPLETE_MARKER).write_text("{}")
    calls: list[str] = []
    assert run_stage(cfg, ENV, "index", _body(calls)) == OK and calls == []


def test_a_stage_that_does_not_finish_is_not_marked(tmp_path: Path) -> None:
    cfg, calls = _cfg(tmp_path), []
    assert run_stage(cfg, ENV, "index", _body(calls, RETRIABLE)) == RETRIABLE
    assert not completed(cfg, "index")
    assert run_stage(cfg, ENV, "index", _body(calls)) == OK and calls == ["ran", "ran"]
