"""The spot notice's two sides without a Ray cluster (training/ray/notice.py): the preStop hook's waits and drains
(the drain itself replaced by a recorder), and the ranks' checkpoint on a notice. The whole path on a local Ray
of simulated nodes is tests/training/ray/test_elastic.py's."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from contract.env import RAY_NOTICE_DIR_ENV
from contract.exit_codes import BAD_INPUT, FAILED, OK
from training.ray import notice

NODE = "ab" * 28


@pytest.fixture
def drains(monkeypatch, tmp_path) -> list[tuple[int, str]]:
    """The preStop hook's drains, recorded (deadline, message); the notice directory under ``tmp_path``."""
    monkeypatch.setenv(RAY_NOTICE_DIR_ENV, str(tmp_path / "notice"))
    monkeypatch.setattr(notice, "POLL_S", 0.05)
    calls: list[tuple[int, str]] = []

    def drain(address: str, node_id: str, deadline_s: int, message: str, timeout_s: float) -> str | None:
        assert node_id == NODE and timeout_s > 0
        calls.append((deadline_s, message))
        return None

    monkeypatch.setattr(notice, "drain", drain)
    return calls


def prestop(*extra: str) -> int:
    return notice.main(["--node-id", NODE, "--deadline-s", "95", "--wait-s", "5", *extra])


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_a_node_without_training_ranks_is_drained_and_let_go_at_once(drains, capsys) -> None:
    folder = notice.node_dir(NODE)
    folder.mkdir(parents=True)
    (folder / "rank-0.pid").write_text(str(dead_pid()))  # a rank of an earlier group, gone
    t0 = time.monotonic()
    assert prestop() == OK
    assert time.monotonic() - t0 < 2
    assert drains == [(95, "pod terminating (spot notice or drain)")]
    assert "no training rank on this node" in capsys.readouterr().out


def test_after_the_ranks_checkpoint_the_deadline_is_brought_forward_and_the_hook_waits_for_them_to_go(drains, capsys):
    folder = notice.node_dir(NODE)
    folder.mkdir(parents=True)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (folder / "rank-1.pid").write_text(str(rank.pid))
    (folder / notice.SAVED).write_text("3")  # an earlier notice's: removed before this one's drain

    def ranks() -> None:  # the ranks: checkpoint step 7 on the notice, then the restarted group stops them
        deadline = time.monotonic() + 10
        while not drains and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        (folder / notice.SAVED).write_text("7")
        time.sleep(0.3)
        rank.kill()
        rank.wait(timeout=30)

    helper = threading.Thread(target=ranks)
    helper.start()
    try:
        assert prestop() == OK
    finally:
        helper.join(timeout=30)
        rank.kill()
    assert [d for d, _ in drains] == [95, 0] and "checkpoint of step 7 saved" in drains[1][1], drains
    assert "checkpoint of step 7 saved; the ranks restarted elsewhere" in capsys.readouterr().out


def test_ranks_that_never_checkpoint_are_waited_for_no_longer_than_asked(drains, capsys) -> None:
    folder = notice.node_dir(NODE)
    folder.mkdir(parents=True)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (folder / "rank-0.pid").write_text(str(rank.pid))
    try:
        t0 = time.monotonic()
        assert notice.main(["--node-id", NODE, "--deadline-s", "95", "--wait-s", "0.5"]) == OK
        assert time.monotonic() - t0 < 3
    finally:
        rank.kill()
        rank.wait(timeout=30)
    assert [d for d, _ in drains] == [95] and "no checkpoint after 0.5s" in capsys.readouterr().out


def test_a_refused_drain_fails_the_hook_and_says_why(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv(RAY_NOTICE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(notice, "drain", lambda *a, **k: "The drain request is not accepted: node is dead")
    assert prestop() == FAILED
    assert "not accepted: node is dead" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--deadline-s", "0", "--wait-s", "5"], ["--deadline-s", "95"],
                                  ["--deadline-s", "95", "--wait-s", "-1"]])
def test_bad_arguments_exit_2_without_a_traceback(argv, capsys) -> None:
    assert notice.main(argv) == BAD_INPUT
    assert "Traceback" not in capsys.readouterr().err


def test_the_drain_is_rays_own_cli_with_the_preemption_reason() -> None:
    argv = notice.drain_command("10.0.0.1:6379", NODE, 95, "spot")
    assert argv[1:4] == ["-m", "ray.scripts.scripts", "drain-node"]
    assert argv[argv.index("--reason") + 1] == "DRAIN_NODE_REASON_PREEMPTION"
    assert argv[argv.index("--deadline-remaining-seconds") + 1] == "95"
    assert argv[argv.index("--node-id") + 1] == NODE


class FakeCheckpointer:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def wait(self) -> None:
        self.calls.append("wait")


@pytest.mark.parametrize(("step", "expected"), [
    (2, ["save", "mark"]),  # not a periodic step: saved now
    (3, ["wait", "mark"]),  # the periodic save of this step began before the hooks: only its commit waited for
    (6, ["save", "mark"]),  # the last step: train() saves it after the loop, so the notice does now
])
def test_the_notice_checkpoints_the_current_step_once(step, expected) -> None:
    calls: list[str] = []
    trainer = SimpleNamespace(step=step, cfg=SimpleNamespace(checkpoint=SimpleNamespace(every_steps=3)),
                              task=SimpleNamespace(max_steps=6), ckpt=FakeCheckpointer(calls),
                              save=lambda blocking: calls.append("save" if blocking else "async"),
                              mark_preempted=lambda: calls.append("mark"))
    notice.NoticeHook._checkpoint(trainer)
    assert calls == expected


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("1", True), ("True", True), ("0", False),
                                                ("false", False), ("", False)])
def test_the_ranks_ask_for_notices_only_while_rays_watcher_runs(value, enabled) -> None:
    from training.localdev.ray_head import PREEMPTION_WATCHER_ENV

    environ = {} if value is None else {PREEMPTION_WATCHER_ENV: value}
    assert notice.watcher_enabled(environ) is enabled


def test_a_drain_that_never_answers_is_a_failure_not_a_hang(monkeypatch) -> None:
    def run(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(notice.subprocess, "run", run)
    assert notice.drain("10.0.0.1:6379", NODE, 95, "spot", timeout_s=10) == "ray drain-node gave no answer in 10s"
