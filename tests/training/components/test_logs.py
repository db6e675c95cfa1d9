"""Stage logs in a process that runs many tasks (a reused Ray worker): each task's records go to its
own run's ``<stage>/log.jsonl`` and nowhere else."""

from __future__ import annotations

import json

from training.components import logs


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_scoped_context_keeps_each_tasks_records_in_its_own_run(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPOOL_LOG_FORMAT", "json")
    run_a, run_b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    outside = logs._CONTEXT
    with logs.scoped_context("a", 0, run_a):
        logs.get_logger("index", True).info("task of run a")
    assert logs._CONTEXT == outside, "the process's own context is back"
    with logs.scoped_context("b", 0, run_b):
        logs.get_logger("index", True).info("task of run b")
    logs.get_logger("index", True).info("after both tasks")

    log_a, log_b = records(run_a / "index" / logs.STAGE_LOG), records(run_b / "index" / logs.STAGE_LOG)
    assert [(r["run_id"], r["message"]) for r in log_a] == [("a", "task of run a")]
    assert [(r["run_id"], r["message"]) for r in log_b] == [("b", "task of run b")]
    assert not any(isinstance(h, logs.logging.FileHandler) for h in logs.logging.getLogger("ragpool.index").handlers)


def test_a_log_file_open_before_the_task_stays_open(tmp_path):
    logs.set_context("outer", 0, tmp_path / "outer")
    try:
        logs.get_logger("evaluate", True).info("outer before")
        with logs.scoped_context("inner", 0, tmp_path / "inner"):
            logs.get_logger("evaluate", True).info("inner")
        logs.get_logger("evaluate", True).info("outer after")
        outer = [r["message"] for r in records(tmp_path / "outer" / "evaluate" / logs.STAGE_LOG)]
        assert outer[0] == "outer before" and outer[-1] == "outer after"
    finally:
        for handler in list(logs.logging.getLogger("ragpool.evaluate").handlers):
            if isinstance(handler, logs.logging.FileHandler):
                logs.logging.getLogger("ragpool.evaluate").removeHandler(handler)
                handler.close()
        logs.set_context("", 0, None)
