"""tests/support/once.py: a session input built once per run, whichever xdist workers ask for it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.once import once_per_run


def _factory(run_dir: Path, worker: str):
    """A stand-in for a worker's tmp_path_factory: xdist gives each worker a base temp under the run's directory."""
    base = run_dir / f"popen-{worker}"
    return SimpleNamespace(getbasetemp=lambda: base, mktemp=lambda name: base / name)


def test_workers_asking_at_once_share_one_build(tmp_path) -> None:
    builds, got = [], {}

    def build(out: Path) -> None:
        builds.append(out)
        time.sleep(0.2)  # long enough for the other workers to ask meanwhile
        (out / "data").write_text("built")

    def ask(worker: str) -> None:
        got[worker] = once_per_run(_factory(tmp_path, worker), worker, "thing", build)

    threads = [threading.Thread(target=ask, args=(f"gw{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(builds) == 1 and set(got.values()) == {tmp_path / "thing"}, (builds, got)
    assert (tmp_path / "thing" / "data").read_text() == "built"


def test_a_failed_build_is_redone_from_an_empty_directory(tmp_path) -> None:
    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        once_per_run(_factory(tmp_path, "gw0"), "gw0", "thing", broken)
    out = once_per_run(_factory(tmp_path, "gw1"), "gw1", "thing", lambda d: (d / "ok").write_text("y"))
    assert sorted(p.name for p in out.iterdir()) == ["ok"]


def test_outside_xdist_each_session_builds_its_own(tmp_path) -> None:
    made = []
    factory = SimpleNamespace(mktemp=lambda name: (tmp_path / name).mkdir() or tmp_path / name)
    out = once_per_run(factory, "master", "thing", made.append)
    assert made == [out] and out == tmp_path / "thing"
