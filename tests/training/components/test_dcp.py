"""DCP checkpoints of an FSDP2-sharded tiny Llama (gloo, CPU): resharding and crash safety.

Each test runs this file as a torchrun worker script (``python -m torch.distributed.run ... test_dcp.py MODE``):
- saved by 2 ranks, loaded on 1 rank, saved again, loaded on 2 ranks: every tensor of the full model
  and optimizer state (gathered with ``full_state_dict``) equal at each hop;
- SIGKILL of a rank inside ``dcp.save`` (blocking, or in the writer thread of a background save while
  training goes on): no new checkpoint appears, the previous one is still the newest verified one and
  loads to exactly the state it held;
- a background (``async_save``) DCP save: training takes a step while the shards are being written, and
  the committed checkpoint holds the state of the step it was started at;
- SIGTERM (the spot notice) while that background save is in flight: the SIGTERM step's checkpoint waits for it,
  and both end verified, the newest loading to the state at SIGTERM.

Every torchrun start costs seconds of imports, so the seeded ``train-save`` on 2 ranks runs once per module
(``saved_by_2``) and so does the 2 -> 1 -> 2 resharding chain (``resharded_2_1_2``); a test that changes a
checkpoint directory works on its own copy (``_copy``). The crashes and the corrupt shard each damage their own
copy, then one ``load-save`` on 2 ranks resumes all of them, each into a fresh model and optimizer
(``after_faults``); the two background-save scenarios run one after the other in one start (``async_saves``),
each in its own directory and reading its committed checkpoint back in the process that wrote it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- worker (under torchrun)


def _build(env):
    """The seeded tiny Llama, FSDP2-sharded over the process group, and its optimizer (a fresh pair each call)."""
    from training.components import sharding as S
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer
    from training.components.optim import build_optimizer
    from training.config.sections import OptimConfig, ParallelismConfig

    model = build_tiny_causal_lm(load_generator_tokenizer(), "llama", 32, 2, 2, 64, 64, seed=7)
    model = S.shard_model(model, ParallelismConfig(strategy="fsdp"), env, "generator")
    return model, build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.01, warmup_steps=0))


def _setup():
    import torch

    from training.components import distributed as D

    env = D.init_distributed("cpu")
    model, opt = _build(env)
    torch.manual_seed(100 + env.rank)
    return env, model, opt


def _train(model, opt, steps: int) -> None:
    import torch

    for _ in range(steps):
        ids = torch.randint(5, 200, (2, 12))
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _dump_full(model, opt, env, out: Path) -> None:
    """Rank 0 writes the gathered full model + optimizer state (FQN keys) to ``out``."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        torch.save({"model": msd, "optimizer": osd}, out)


def _save(root: Path, step: int, model, opt, env) -> None:
    from training.components.dcp import save_dcp_checkpoint

    save_dcp_checkpoint(root, step, model, opt, {"trainer": {"step": step}}, env, keep_latest_k=3)


def _save_async(root: Path, step: int, model, opt, env):
    """Start a background DCP save as the Trainer does (``checkpoint.async_save``); returns its Checkpointer."""
    from training.components.checkpoint import Checkpointer

    ckpt = Checkpointer(root, 3, env.is_main)
    ckpt.save_dcp(step, model, opt, {"trainer": {"step": step}}, env, blocking=False)
    ckpt.wait_snapshot()  # as the loop does before optimizer.step()
    return ckpt


#: Bound on how long a patched ``write_data`` waits for the training thread to finish its next step.
OVERLAP_WAIT_S = 60


def _load_latest(root: Path, model, opt, env) -> int:
    """As the Trainer resumes: sharded ranks verify the newest checkpoint together, one process alone."""
    from training.components import distributed as D
    from training.components.checkpoint import Checkpointer
    from training.components.checkpoint_dirs import step_dir_name
    from training.components.dcp import load_dcp_state, newest_verified

    ckpt = Checkpointer(root, 3, env.is_main)
    ckpt.clean_temp()
    if env.world_size > 1:
        D.barrier(env)
        step = newest_verified(root, env)
    else:
        step = ckpt.latest()[0]
    load_dcp_state(root / step_dir_name(step), model, opt)
    return step


def _load_dump_save(root: Path, model, opt, env) -> None:
    """Load the newest verified checkpoint, dump what was loaded, save it again as the next step."""
    step = _load_latest(root, model, opt, env)
    _dump_full(model, opt, env, root / f"full-loaded-{env.world_size}-from-{step}.pt")
    _save(root, step + 1, model, opt, env)


def _async_overlap(root: Path, env, model, opt) -> None:
    """A background save whose shards are written only once training took another step (``async-saves``)."""
    import threading

    import torch.distributed.checkpoint.filesystem as fs

    real = fs.FileSystemWriter.write_data
    stepped = threading.Event()
    seen: dict[str, bool] = {}

    def write_after_a_step(self, plan, planner):  # the shards are written only once training moved on
        seen["step_done_before_write"] = stepped.wait(OVERLAP_WAIT_S)
        return real(self, plan, planner)

    _train(model, opt, 2)
    _dump_full(model, opt, env, root / "full-saved-2.pt")
    fs.FileSystemWriter.write_data = write_after_a_step
    ckpt = _save_async(root, 2, model, opt, env)
    _train(model, opt, 1)  # changes every weight while step 2's save is in flight
    stepped.set()
    ckpt.wait()
    assert ckpt.last_saved_step == (2 if env.is_main else None)
    (root / f"overlap-{env.rank}.json").write_text(json.dumps(seen))
    # What was committed, read back from disk into a fresh model and optimizer (as a resume would).
    fs.FileSystemWriter.write_data = real
    _load_dump_save(root, *_build(env), env)


def _sigterm_during_async_save(root: Path, env, model, opt) -> None:
    """The SIGTERM checkpoint of step 3 while step 2's background save is still writing (``async-saves``)."""
    import threading

    import torch.distributed.checkpoint.filesystem as fs

    from training.components.loop import _StopFlag

    real = fs.FileSystemWriter.write_data
    preempt_save_started = threading.Event()
    seen: dict[str, bool] = {}

    def write_once_preempted(self, plan, planner):  # step 2's shards wait for the preempted save to begin
        if "released" not in seen:
            seen["released"] = preempt_save_started.wait(OVERLAP_WAIT_S)
        return real(self, plan, planner)

    _train(model, opt, 2)
    fs.FileSystemWriter.write_data = write_once_preempted
    ckpt = _save_async(root, 2, model, opt, env)  # the periodic background save of step 2
    _train(model, opt, 1)  # step 3
    stop = _StopFlag()
    stop.install()
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun forwards the pod's SIGTERM to every rank
    import time

    deadline = time.monotonic() + 10
    while not stop.requested and time.monotonic() < deadline:  # the handler runs on the main thread
        time.sleep(0.01)
    assert stop.requested
    stop.restore()
    _dump_full(model, opt, env, root / "full-sigterm-3.pt")
    in_flight_wait = ckpt.wait

    def wait_in_flight() -> None:  # what the preempted save finds: step 2 not yet committed
        seen["step_2_in_flight"] = not (root / "step_000002").exists()
        preempt_save_started.set()
        in_flight_wait()

    ckpt.wait = wait_in_flight
    # Trainer._stop_and_checkpoint -> Trainer.save(blocking=True) on a sharded run:
    ckpt.save_dcp(3, model, opt, {"trainer": {"step": 3}}, env, blocking=True)
    seen["step_2_committed_before_return"] = (root / "step_000002" / "manifest.json").exists()
    assert ckpt.last_saved_step == (3 if env.is_main else None)
    (root / f"sigterm-{env.rank}.json").write_text(json.dumps(seen))
    fs.FileSystemWriter.write_data = real
    _load_dump_save(root, *_build(env), env)  # resumed: the newest verified checkpoint, into a fresh model


def worker(mode: str, root: Path, *more_roots: Path) -> None:
    import torch

    env, model, opt = _setup()
    if mode == "train-save":
        _train(model, opt, 2)
        _save(root, 2, model, opt, env)
        _dump_full(model, opt, env, root / f"full-saved-{env.world_size}.pt")
    elif mode == "load-save":  # each root in turn, into a fresh model and optimizer, as a resumed process would
        _load_dump_save(root, model, opt, env)
        for other in more_roots:
            _load_dump_save(other, *_build(env), env)
    elif mode in ("crash-in-save", "crash-in-async-save"):
        import torch.distributed.checkpoint.filesystem as fs

        real = fs.FileSystemWriter.write_data

        def write_then_die(self, plan, planner):  # rank 0's shard is on disk, the save is not done
            out = real(self, plan, planner)
            if env.rank == 0:  # the rank that would clean up on an error: the temp dir stays
                out.wait()
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        _train(model, opt, 1)
        fs.FileSystemWriter.write_data = write_then_die
        if mode == "crash-in-save":
            _save(root, 4, model, opt, env)
        else:  # the writer thread dies with the process while the training thread keeps stepping
            ckpt = _save_async(root, 4, model, opt, env)
            _train(model, opt, 1)
            ckpt.wait()
    elif mode == "async-saves":  # two scenarios of one process group, each with a fresh model and optimizer
        _async_overlap(root, env, model, opt)
        torch.manual_seed(100 + env.rank)  # as _setup left it for the first
        _sigterm_during_async_save(more_roots[0], env, *_build(env))
    else:
        raise SystemExit(f"unknown mode {mode}")
    from training.components import distributed as D

    D.destroy()


# --------------------------------------------------------------------------- tests


def _torchrun(mode: str, root: Path, nproc: int, *more_roots: Path,
             timeout: int = 180) -> subprocess.CompletedProcess[str]:
    from tests.support.training import stage_env
    from training.scheduler.worker.child import torchrun_argv

    cmd = torchrun_argv([str(Path(__file__).resolve()), mode, *map(str, (root, *more_roots))], nproc=nproc)
    return subprocess.run(cmd, cwd=REPO, env={**stage_env(), "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=timeout)


def _assert_same_state(a_path: Path, b_path: Path) -> int:
    """Every tensor of model and optimizer state equal (and the same keys); returns how many were compared."""
    import torch

    a, b = (torch.load(p, weights_only=False) for p in (a_path, b_path))

    def leaves(tree, prefix=""):
        if isinstance(tree, dict):
            for k, v in tree.items():
                yield from leaves(v, f"{prefix}{k}/")
        elif isinstance(tree, (list, tuple)):
            for i, v in enumerate(tree):
                yield from leaves(v, f"{prefix}{i}/")
        else:
            yield prefix, tree

    la, lb = dict(leaves(a)), dict(leaves(b))
    assert la.keys() == lb.keys()
    unequal = [k for k in la if (torch.is_tensor(la[k]) and not torch.equal(la[k], lb[k]))
               or (not torch.is_tensor(la[k]) and la[k] != lb[k])]
    assert unequal == [], f"{a_path.name} vs {b_path.name}: {unequal[:5]}"
    n = sum(torch.is_tensor(v) for v in la.values())
    assert any("exp_avg_sq" in k for k in la) and n > 20, "optimizer state missing: the check would be vacuous"
    return n


def _copy(src: Path, dst: Path) -> Path:
    """``dst`` (a test's own ``tmp_path``) holding a copy of the shared checkpoint directory ``src``."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


@pytest.fixture(scope="module")
def saved_by_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``train-save`` on 2 ranks: checkpoint step 2 and its gathered state ``full-saved-2.pt``. Read-only:
    tests that add to it work on a ``_copy``."""
    root = tmp_path_factory.mktemp("dcp_saved_by_2")
    out = _torchrun("train-save", root, 2)
    assert out.returncode == 0, f"train-save x2:\n{out.stderr[-3000:]}"
    return root


@pytest.fixture(scope="module")
def resharded_2_1_2(saved_by_2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``saved_by_2`` loaded on 1 rank and saved as step 3, then loaded on 2 ranks and saved as step 4, each
    hop dumping the state it loaded (``full-loaded-{world}-from-{step}.pt``). Read-only, as ``saved_by_2``."""
    root = _copy(saved_by_2, tmp_path_factory.mktemp("dcp_resharded_2_1_2"))
    for nproc in (1, 2):
        out = _torchrun("load-save", root, nproc)
        assert out.returncode == 0, f"load-save x{nproc}:\n{out.stderr[-3000:]}"
    return root


def test_manifest_sizes_and_crcs_computed_while_writing_are_those_of_the_files(tmp_path) -> None:
    """One process (no process group): the manifest's entries, checksummed as DCP's bytes passed, name
    exactly the files on disk with their sizes and CRC32Cs as read back, and the checkpoint loads equal."""
    import torch

    from training.components.checkpoint_dirs import file_checksum, verify_checkpoint_dir
    from training.components.dcp import load_dcp_state, save_dcp_checkpoint
    from training.components.distributed import DistEnv
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer
    from training.components.optim import build_optimizer
    from training.config.sections import OptimConfig

    def build():
        model = build_tiny_causal_lm(load_generator_tokenizer(), "llama", 32, 2, 2, 64, 64, seed=7)
        return model, build_optimizer(model, OptimConfig(lr=1e-2, warmup_steps=0))

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    model, opt = build()
    ids = torch.randint(5, 200, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    path = save_dcp_checkpoint(tmp_path, 1, model, opt, {"trainer": {"step": 1}}, env, keep_latest_k=1)
    files = json.loads((path / "manifest.json").read_text())["files"]
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(files) == on_disk and {"dcp/.metadata", "trainer.pt"} < on_disk, (files, on_disk)
    for name, entry in files.items():
        assert entry["bytes"] == (path / name).stat().st_size, name
        assert entry["crc32c"] == file_checksum(path / name, "crc32c"), name
    assert verify_checkpoint_dir(path) is None
    other, other_opt = build()
    load_dcp_state(path, other, other_opt)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg_sq"], other_opt.state_dict()["state"][0]["exp_avg_sq"])


@pytest.mark.slow
@pytest.mark.torch_multiproc
def test_saved_by_2_loads_on_1_and_back_on_2(resharded_2_1_2) -> None:
    saved = resharded_2_1_2 / "full-saved-2.pt"
    _assert_same_state(saved, resharded_2_1_2 / "full-loaded-1-from-2.pt")
    _assert_same_state(saved, resharded_2_1_2 / "full-loaded-2-from-3.pt")
    manifest = json.loads((resharded_2_1_2 / "step_000003" / "manifest.json").read_text())
    assert manifest["format"] == "dcp" and manifest["world_size"] == 1  # written by the 1-rank hop


CRASHES = ("crash-in-save", "crash-in-async-save")
"""The worker modes that SIGKILL rank 0 inside a DCP save: blocking, and in a background save's writer thread."""


@pytest.fixture(scope="module")
def after_faults(saved_by_2: Path, resharded_2_1_2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each fault on its own copy, then one 2-rank ``load-save`` over all of them (each directory into a fresh
    model and optimizer, as a resumed process would): ``{name: (directory, what the fault left or did)}`` and
    ``"load"``: the load's completed process. Faults: ``CRASHES`` on a copy of ``saved_by_2`` (newest step 2; the
    killed torchrun and the temp dirs it left), ``corrupt`` on a copy of ``resharded_2_1_2`` (newest step 4, saved
    by 2 ranks: one byte flipped in a shard only rank 1 reads; step 3, saved by 1 rank, is the one before)."""
    out: dict = {}
    for crash in CRASHES:
        root = _copy(saved_by_2, tmp_path_factory.mktemp(crash))
        crashed = _torchrun(crash, root, 2)
        out[crash] = (root, crashed, sorted(p.name for p in root.iterdir()))
    root = _copy(resharded_2_1_2, tmp_path_factory.mktemp("corrupt"))
    newest = root / "step_000004"
    manifest = json.loads((newest / "manifest.json").read_text())
    files = sorted(manifest["files"])
    victim = newest / files[1]  # sorted(files)[1::2] is rank 1's share
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    (root / "full-loaded-2-from-3.pt").unlink()
    out["corrupt"] = (root, manifest, victim)
    first, *more = (out[name][0] for name in (*CRASHES, "corrupt"))
    out["load"] = _torchrun("load-save", first, 2, *more)
    return out


@pytest.mark.slow
@pytest.mark.torch_multiproc
@pytest.mark.parametrize("crash", CRASHES)
def test_sigkill_during_dcp_save_leaves_the_previous_checkpoint(after_faults, crash: str) -> None:
    root, crashed, left = after_faults[crash]
    assert crashed.returncode != 0 and "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    temps = [name for name in left if name.startswith(".tmp-step_000004")]
    assert temps, f"the killed save left no temp dir: it did not die inside the save ({left})"
    assert "step_000004" not in left, left
    load = after_faults["load"]
    assert load.returncode == 0, load.stderr[-3000:]
    _assert_same_state(root / "full-saved-2.pt", root / "full-loaded-2-from-2.pt")
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir()), "resume cleans the crashed temp dir"


@pytest.fixture(scope="module")
def async_saves(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """``async-saves`` on 2 ranks: the background-save overlap in its root, then the SIGTERM during a background
    save in the other (each with a fresh model and optimizer, one torchrun start for both). ``(process, overlap
    root, SIGTERM root)``."""
    overlap, sigterm = tmp_path_factory.mktemp("dcp_async_overlap"), tmp_path_factory.mktemp("dcp_async_sigterm")
    return _torchrun("async-saves", overlap, 2, sigterm), overlap, sigterm


@pytest.mark.slow
@pytest.mark.torch_multiproc
def test_async_dcp_save_writes_while_training_steps_and_commits_the_state_it_started_at(async_saves) -> None:
    """The writer thread's ``write_data`` waits (up to OVERLAP_WAIT_S) for the training thread to finish a
    step after the save started: a blocking save would time out there. The committed step-2 checkpoint,
    read back on the 2 ranks into a fresh model and optimizer, equals the state dumped at step 2, not the state
    after the step taken meanwhile."""
    out, tmp_path, _ = async_saves
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"overlap-{rank}.json").read_text())
        assert seen == {"step_done_before_write": True}, f"rank {rank}: no step ran while the shards were written"
    manifest = json.loads((tmp_path / "step_000002" / "manifest.json").read_text())
    assert manifest["format"] == "dcp" and "trainer.pt" in manifest["files"]
    assert sum(n.endswith(".distcp") for n in manifest["files"]) == 2
    _assert_same_state(tmp_path / "full-saved-2.pt", tmp_path / "full-loaded-2-from-2.pt")


@pytest.mark.slow
@pytest.mark.torch_multiproc
def test_sigterm_during_an_async_dcp_save_waits_for_it_then_checkpoints_the_sigterm_step(async_saves) -> None:
    """The spot notice arrives while the periodic background save of step 2 is still writing (its ``write_data``
    is held until the preempted save starts). The SIGTERM checkpoint of step 3 (what ``Trainer._stop_and_checkpoint``
    calls: a blocking ``save_dcp``) first waits for step 2's commit (one save in flight at most, never two writers
    interleaving their collectives), then writes step 3. Both are verified checkpoints and a resume on the 2 ranks
    loads step 3 exactly as it was at SIGTERM."""
    from training.components.checkpoint_dirs import verify_checkpoint_dir

    out, _, tmp_path = async_saves
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"sigterm-{rank}.json").read_text())
        assert seen == {"released": True, "step_2_in_flight": True, "step_2_committed_before_return": True}, \
            f"rank {rank}: {seen}"
    for step in (2, 3):
        assert verify_checkpoint_dir(tmp_path / f"step_{step:06d}") is None, step
    _assert_same_state(tmp_path / "full-sigterm-3.pt", tmp_path / "full-loaded-2-from-3.pt")


@pytest.mark.slow
@pytest.mark.torch_multiproc
def test_a_corrupt_shard_is_found_by_the_rank_that_reads_it_and_the_previous_checkpoint_loads(after_faults) -> None:
    """Ranks split the CRC reading of a sharded checkpoint; a shard only rank 1 reads is corrupt
    (same size, one byte flipped): every rank skips that checkpoint and loads the one before.
    The chain's step 4 (saved by 2 ranks) is the newest, step 3 (saved by 1 rank) the one before, both
    holding step 2's state."""
    root, manifest, victim = after_faults["corrupt"]
    assert manifest["world_size"] == 2, "the newest checkpoint must be sharded for the ranks to split its reading"
    assert victim.name.endswith(".distcp"), manifest["files"]
    load = after_faults["load"]
    assert load.returncode == 0, load.stderr[-3000:]
    assert "skipping checkpoint" in load.stderr and "CRC32C mismatch" in load.stderr, load.stderr[-3000:]
    assert f"{root / 'step_000004'}" in load.stderr, load.stderr[-3000:]  # this directory's, not another's
    _assert_same_state(root / "full-saved-2.pt", root / "full-loaded-2-from-3.pt")


if __name__ == "__main__":
    from training.components.stage import exit_process

    worker(sys.argv[1], *map(Path, sys.argv[2:]))
    exit_process(0)  # as a stage command ends: no finalization for Gloo's threads to abort
