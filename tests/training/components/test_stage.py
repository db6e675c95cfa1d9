"""training.components.stage: the one completion prologue every stage runs through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.components.distributed import DistEnv
from training.components.stage import (COMPLETE_MARKER, FINGERPRINT_KEY, complete_stage, completed, run_stage,
                                       stage_fingerprint)
from training.config.run import load_run_config
from training.config.sections import ConfigError
from contract.exit_codes import OK, RETRIABLE

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


EXITING = """
import atexit, logging, os, sys
from training.components.stage import exit_process

out = sys.argv[1]
atexit.register(lambda: open(out + "/atexit", "w").write("ran"))
log = logging.getLogger("exiting")
log.addHandler(logging.FileHandler(out + "/log"))
log.warning("kept")
sys.stdout.write("no newline, still buffered")


class Finalized:  # only a finalizing interpreter (module teardown) runs this; builtins may be gone by then
    def __del__(self, _write=os.write, _fd=os.open(out + "/finalized", os.O_WRONLY | os.O_CREAT)):
        _write(_fd, b"finalized")


kept = Finalized()
exit_process(3)
"""


def test_a_stage_process_exits_with_its_code_after_its_exit_handlers_without_finalizing(tmp_path: Path) -> None:
    """``exit_process``: the code, the exit handlers run, logs and stdout flushed, and no interpreter
    finalization (where Gloo's threads abort a rank: training/components/stage.py)."""
    import subprocess
    import sys

    from contract.paths import child_env

    out = subprocess.run([sys.executable, "-c", EXITING, str(tmp_path)], cwd=Path(__file__).resolve().parents[3],
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr[-2000:]
    assert out.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "log").read_text() == "kept\n"
    assert (tmp_path / "finalized").read_text() == "", "the interpreter was finalized"


RANK_BENCHES = ("bench/fsdp_memory.py", "bench/train_throughput.py")
"""The benchmarks whose script is also a torchrun rank (``--worker``)."""


def test_every_command_that_runs_as_a_rank_ends_through_exit_process() -> None:
    import ast

    from training.config.sections import STAGES

    repo = Path(__file__).resolve().parents[3]

    def main_block(path: Path) -> str:
        tree = ast.parse(path.read_text())
        main = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert main, path
        return ast.unparse(main[0])

    for name in (*STAGES, "pipeline"):
        body = main_block(repo / "training" / f"{name}.py")
        assert body.splitlines()[1].strip().startswith("exit_process(run_main("), name
    for script in RANK_BENCHES:
        assert "exit_process(main())" in main_block(repo / script), script


def test_every_rank_program_in_the_tests_ends_through_exit_process() -> None:
    """The tests' own rank programs (spawned workers, inline torchrun scripts) end as the commands do: CI's stop 35
    lost a run of test_distributed to a spawned Gloo rank that aborted while finalizing (exit -6, no traceback)."""
    import re

    tests = Path(__file__).resolve().parents[2]
    starts = re.compile(r"\b(init_process_group|init_distributed)\(")
    for path in sorted(tests.rglob("test_*.py")):
        text = path.read_text()
        if path != Path(__file__).resolve() and starts.search(text):
            assert text.count("exit_process(") >= len(starts.findall(text)), path
