"""training/elastic/resizes.py: the cause of a resize and the marks read back (the loop writing them in a real
elastic run: tests/training/elastic/test_launch.py; shown by tests/training/reports/test_report.py)."""

from __future__ import annotations

from training.elastic import resizes


def test_the_cause_of_a_resize() -> None:
    assert resizes.cause(2, 3, preempted_step=15, resumed_step=15) == resizes.JOINED  # torch's SIGTERM at a join
    assert resizes.cause(3, 2, preempted_step=19, resumed_step=19) == resizes.NOTICE  # checkpointed on the way out
    assert resizes.cause(3, 2, preempted_step=None, resumed_step=4) == resizes.LOST
    assert resizes.cause(3, 2, preempted_step=8, resumed_step=12) == resizes.LOST  # an older attempt's marker


def test_marks_read_back_in_order_and_a_torn_line_is_skipped(tmp_path) -> None:
    assert resizes.read(tmp_path) == []
    first = resizes.mark(4, 6, 4, 2, resizes.LOST, 10.0)
    assert (first["from_nodes"], first["to_nodes"]) == (3, 2)
    resizes.append(tmp_path, first)
    with open(tmp_path / resizes.RESIZES_FILE, "a") as fh:
        fh.write('{"at": 11.0, "step": 5\n["not a mark"]\n')
    resizes.append(tmp_path, resizes.mark(9, 4, 6, 2, resizes.JOINED, 12.0))
    assert [(m["step"], m["cause"]) for m in resizes.read(tmp_path)] == [(4, resizes.LOST), (9, resizes.JOINED)]
