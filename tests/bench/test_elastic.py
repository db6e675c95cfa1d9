"""bench/elastic.py: its arguments and the figures it reads from step records (the scenario itself runs in
tests/training/elastic/test_launch.py, through the same harness)."""

from __future__ import annotations

import pytest

from bench import elastic
from contract.exit_codes import BAD_INPUT


def _record(step: int, world: int, loss: float, t: float) -> dict:
    return {"step": step, "world": world, "accum": 6 // world, "loss": loss, "t": t}


def test_figures_of_a_shrink_and_a_grow() -> None:
    steps = [_record(s, 3, 2.0, s) for s in range(1, 7)]            # lost after 6; checkpoint at 4
    steps += [_record(s, 2, 1.9, 20 + s) for s in range(5, 15)]     # resumed at 4, held at 14
    steps += [_record(s, 3, 1.8, 40 + s) for s in range(16, 19)]    # 15 ran and was saved at the join's SIGTERM
    steps += [_record(s, 2, 1.7, 60 + s) for s in range(20, 25)]    # 19 ran and was saved at the spot notice
    got = elastic.figures(steps, killed=15.0, joined=50.0, noticed=75.0, kill_at=6, checkpoint_every=4)
    assert (got["lost_steps_sigkill"], got["lost_steps_join"], got["lost_steps_sigterm"]) == (2, 0, 0)
    assert (got["resize_s"], got["grow_s"], got["notice_resize_s"]) == (10.0, 6.0, 5.0)
    assert (got["worlds"], got["final_step"], got["loss_continuity"]) == ([3, 2, 3, 2], 24, True)
    steps[6]["loss"] = 9.0  # a jump after the resize
    assert not elastic.figures(steps, 15.0, 50.0, 75.0, 6, 4)["loss_continuity"]


def test_goodput_of_elastic_against_a_full_gang_requeue() -> None:
    # A 600 s run of 3 nodes loses one at 300 s; the replacement comes 300 s later. Elastic, never replaced: 10 s
    # down, the 301 s left (1 s redone) on 2 nodes. Grown back: 290 s on 2 nodes (193.3 s of full-gang work), 15 s
    # to grow, the remaining 107.7 s on 3. Requeue: waits 300 s, restarts in 15 s, redoes 1 s, trains 300 s.
    got = elastic.goodput(600, 300, 3, resize_s=10, grow_s=15, redo_s=1)
    assert got["elastic_s"] == pytest.approx(300 + 10 + 301 * 3 / 2, abs=0.01) and got["requeue_s"] == 916
    assert got["elastic_grown_s"] == pytest.approx(300 + 10 + 290 + 15 + 301 - 290 * 2 / 3, abs=0.01)
    assert got["ratio"] == pytest.approx(916 / got["elastic_s"], abs=1e-3) and got["requeue_loss_s"] == 316
    assert got["ratio_grown"] == pytest.approx(916 / got["elastic_grown_s"], abs=1e-3)
    # A run short enough to end on the survivors before the replacement arrives: 100 + 10 + 101 / (2/3).
    short = elastic.goodput(200, 300, 3, 10, 15, 1)
    assert short["elastic_s"] == short["elastic_grown_s"] == pytest.approx(261.5)
    # The ratio falls as the run grows; the goal holds up to the returned length and not beyond.
    up_to = elastic.goal_up_to(300, 3, 10, 15, 1)
    assert elastic.goodput(up_to, 300, 3, 10, 15, 1)["ratio"] >= elastic.GOODPUT_GOAL
    assert elastic.goodput(up_to + 2, 300, 3, 10, 15, 1)["ratio"] < elastic.GOODPUT_GOAL
    assert elastic.goal_up_to(0, 3, 10, 15, 1) == 0  # no wait: nothing to win
    # An ideal elastic run (no cost, no step lost) meets the goal while (T + 300) / (1.25 T) >= 1.5: T <= 342.9 s.
    assert elastic.goal_up_to(300, 3, 0, 0, 0) == 342


def test_the_resize_goal_counts_from_a_nodes_liveness() -> None:
    assert elastic.liveness_s() == 5.0  # keep_alive_interval=1 x keep_alive_max_attempt=5


def test_bad_arguments_exit_2_and_measure_nothing(tmp_path, capsys) -> None:
    (tmp_path / "old").write_text("x")
    assert elastic.main(["--out", str(tmp_path)]) == BAD_INPUT
    assert elastic.main(["--kill-at-step", "20"]) == BAD_INPUT
    assert elastic.main(["--sim-run-s", "0"]) == BAD_INPUT
    err = capsys.readouterr().err
    assert "not empty" in err and "--kill-at-step" in err and "--sim-run-s" in err
