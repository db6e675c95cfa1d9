"""training.components.checkpoint_dirs: the manifest's checksums, early writeback, snapshots."""

from __future__ import annotations

import json

import torch

from training.components.checkpoint import Checkpointer
from training.components.checkpoint_dirs import snapshot, verify_checkpoint_dir, write_checkpoint_dir


def _state(v: float) -> dict:
    return {"model": {"w": torch.full((64, 64), v)}, "trainer": {"step": int(v), "rng": [[1, 2, 3]]}}


def test_manifest_checksum_is_crc32c_of_the_file_bytes(tmp_path) -> None:
    import crc32c

    path = write_checkpoint_dir(tmp_path, 1, _state(1.0))
    files = json.loads((path / "manifest.json").read_text())["files"]
    for name, meta in files.items():
        data = (path / name).read_bytes()
        assert meta == {"bytes": len(data), "crc32c": crc32c.crc32c(data)}


def test_writeback_starts_early_over_contiguous_ranges(tmp_path, monkeypatch) -> None:
    import sys

    import training.components.checkpoint_dirs as ck

    if sys.platform.startswith("linux"):
        assert ck._sync_file_range is not None  # the real libc call is what the other tests use
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(ck, "_sync_file_range", lambda fd, off, n, flags: calls.append((off, n)) or 0)
    big = {"model": {"w": torch.randn((12 << 20) // 4), "v": torch.randn((12 << 20) // 4), "u": torch.randn((12 << 20) // 4)}}
    path = write_checkpoint_dir(tmp_path, 1, big)
    assert verify_checkpoint_dir(path) is None
    size = (path / "model.pt").stat().st_size
    assert calls and calls[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in zip(calls, calls[1:])), calls  # no gaps, no overlaps
    assert all(n >= ck._WRITEBACK_EVERY for _, n in calls)
    assert calls[-1][0] + calls[-1][1] <= size


def test_writeback_unsupported_falls_back_to_the_final_fsync(tmp_path, monkeypatch) -> None:
    import training.components.checkpoint_dirs as ck

    calls: list[int] = []
    monkeypatch.setattr(ck, "_sync_file_range", lambda fd, off, n, flags: calls.append(off) or -1)
    state = {"model": {"w": torch.randn((40 << 20) // 4)}}
    write_checkpoint_dir(tmp_path, 1, state)
    assert len(calls) == 1  # tried once, then left to fsync
    _, states = Checkpointer(tmp_path, 1, True).latest()
    assert torch.equal(states["model"]["w"], state["model"]["w"])


def test_snapshot_is_a_deep_cpu_copy() -> None:
    live = {"a": torch.ones(3), "b": [torch.zeros(2)], "c": (1, "x")}
    snap = snapshot(live)
    live["a"].add_(1)
    live["b"][0].add_(1)
    assert torch.equal(snap["a"], torch.ones(3)) and torch.equal(snap["b"][0], torch.zeros(2))
    assert snap["c"] == (1, "x")
