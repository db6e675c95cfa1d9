"""training.components.checkpoint: atomic layout, skipping bad ones, retention, background save."""

from __future__ import annotations

import json

import pytest
import torch

from training.components.checkpoint import Checkpointer, CheckpointError
from training.components.checkpoint_dirs import list_checkpoints, verify_checkpoint_dir, write_checkpoint_dir


def _state(v: float) -> dict:
    return {"model": {"w": torch.full((64, 64), v)}, "trainer": {"step": int(v), "rng": [[1, 2, 3]]}}


def test_write_is_complete_and_loadable(tmp_path) -> None:
    path = write_checkpoint_dir(tmp_path, 7, _state(7.0))
    assert path.name == "step_000007"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "model.pt", "trainer.pt"]
    assert verify_checkpoint_dir(path) is None
    assert not list(tmp_path.glob(".tmp-*"))
    step, states = Checkpointer(tmp_path, 3, True).latest()
    assert step == 7 and torch.equal(states["model"]["w"], torch.full((64, 64), 7.0))
    assert states["trainer"]["rng"] == [[1, 2, 3]]


def test_truncated_newest_checkpoint_is_skipped(tmp_path, caplog) -> None:
    write_checkpoint_dir(tmp_path, 1, _state(1.0))
    newest = write_checkpoint_dir(tmp_path, 2, _state(2.0))
    model = newest / "model.pt"
    model.write_bytes(model.read_bytes()[:100])
    assert "truncated" in verify_checkpoint_dir(newest)
    step, states = Checkpointer(tmp_path, 3, True).latest()
    assert step == 1 and float(states["model"]["w"][0, 0]) == 1.0
    assert "skipping checkpoint" in caplog.text and "step_000002" in caplog.text


def test_corrupt_and_manifestless_checkpoints_are_skipped(tmp_path) -> None:
    write_checkpoint_dir(tmp_path, 1, _state(1.0))
    corrupt = write_checkpoint_dir(tmp_path, 2, _state(2.0))
    data = bytearray((corrupt / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    (corrupt / "model.pt").write_bytes(bytes(data))
    assert "CRC32C mismatch" in verify_checkpoint_dir(corrupt)
    partial = tmp_path / "step_000003"
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")
    assert "no manifest" in verify_checkpoint_dir(partial)
    (tmp_path / ".tmp-step_000004-abcd").mkdir()  # crashed writer
    assert Checkpointer(tmp_path, 3, True).latest()[0] == 1


def test_checkpoints_with_a_legacy_crc32_manifest_still_verify(tmp_path) -> None:
    """Checkpoints written before CRC32C (zlib CRC32 in the manifest) must stay resumable."""
    import zlib

    path = write_checkpoint_dir(tmp_path, 1, _state(1.0))
    mpath = path / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["files"] = {name: {"bytes": meta["bytes"], "crc32": zlib.crc32((path / name).read_bytes())}
                         for name, meta in manifest["files"].items()}
    mpath.write_text(json.dumps(manifest))
    assert verify_checkpoint_dir(path) is None
    assert Checkpointer(tmp_path, 3, True).latest()[0] == 1
    manifest["files"]["model.pt"]["crc32"] ^= 1
    mpath.write_text(json.dumps(manifest))
    assert "CRC32 mismatch" in verify_checkpoint_dir(path)
    del manifest["files"]["model.pt"]["crc32"]
    mpath.write_text(json.dumps(manifest))
    assert "no checksum" in verify_checkpoint_dir(path)


def test_none_when_nothing_usable(tmp_path) -> None:
    assert Checkpointer(tmp_path / "nope", 2, True).latest() is None


def test_keep_latest_k_and_background_save(tmp_path) -> None:
    seen = []
    ck = Checkpointer(tmp_path, keep_latest_k=2, is_main=True, on_saved=lambda s, d: seen.append(s))
    for step in (1, 2, 3, 4):
        state = _state(float(step))
        ck.save(step, state, blocking=False)  # live tensors, as the training loop passes them
        ck.wait_snapshot()
        state["model"]["w"].fill_(-1)  # an update after the copy must not reach the checkpoint
    ck.wait()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert seen == [1, 2, 3, 4]
    step, states = ck.latest()
    assert step == 4 and float(states["model"]["w"][0, 0]) == 4.0
    manifest = json.loads((tmp_path / "step_000004" / "manifest.json").read_text())
    assert manifest["step"] == 4 and set(manifest["files"]) == {"model.pt", "trainer.pt"}


def test_non_main_rank_writes_nothing(tmp_path) -> None:
    Checkpointer(tmp_path, 2, is_main=False).save(1, _state(1.0), blocking=True)
    assert list_checkpoints(tmp_path) == []


def test_background_failure_surfaces_on_the_training_thread(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    ck = Checkpointer(blocker / "ckpt", 2, True)
    ck.save(1, _state(1.0), blocking=False)
    with pytest.raises(CheckpointError, match="failed"):
        ck.wait()
