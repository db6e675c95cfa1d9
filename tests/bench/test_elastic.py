"""bench/elastic.py: its arguments and the figures it reads from step records (the scenario itself runs in
tests/training/elastic/test_launch.py, through the same harness)."""

from __future__ import annotations

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


def test_bad_arguments_exit_2_and_measure_nothing(tmp_path, capsys) -> None:
    (tmp_path / "old").write_text("x")
    assert elastic.main(["--out", str(tmp_path)]) == BAD_INPUT
    assert elastic.main(["--kill-at-step", "20"]) == BAD_INPUT
    err = capsys.readouterr().err
    assert "not empty" in err and "--kill-at-step" in err
