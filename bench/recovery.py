"""Requeue and resume, measured: a worker holding a training run is lost (SIGKILL, no SIGTERM),
and another worker picks the run up from its last checkpoint.

    python -m bench.recovery [--lease-seconds 15] [--checkpoint-every 8] [--max-steps 32] [--nproc 2]

1. A local ``redis-server`` (training/localdev/redis_server.py), the synthetic dataset and a tiny
   encoder under ``--out``.
2. Reference: the run (retriever fine-tuning, CPU, ``--nproc`` ranks, a checkpoint every
   ``--checkpoint-every`` steps) goes through the queue to one worker, uninterrupted.
3. The same run under another id, with two workers (``python -m training.worker``, each in its own
   session, pre-flight health check on). The first attempt's ranks wait after step ``--kill-at-step``
   (a step hook, ``bench/recovery_pause.py``: the kill lands there on a machine of any speed, never
   after the last step), and the holder and every process under it (torchrun, the ranks) get SIGKILL
   at once: a lost node. The other worker claims the run once the lease expires and resumes from
   the checkpoint.
4. One JSON line last:

   - ``time_to_resume_s``: from the kill to the first training step the other worker's run logs
     (``runs/<id>/logs/attempt-2-node-0.log``: the line's ``ts`` for JSON log lines, else the
     moment the bench read it); None when attempt 2 found the stage already complete
     (``resumed_already_complete``: it had no step left to log), with ``kill_to_claim_s`` measured;
   - ``lost_steps``: steps done twice = the last step attempt 1 logged - the step attempt 2
     resumed from (the stage's completion marker);
   - ``checkpoint_interval_steps``, ``lease_seconds``;
   - ``final_params_match``: the interrupted run's final weights equal the reference's, bit for bit;
   - ``goals``: lost_steps <= one checkpoint interval, time_to_resume_s (or, with nothing left to
     train, kill_to_claim_s) <= lease + 30 s, final_params_match. Exit 0 when all hold, 1 otherwise,
     2 on bad arguments.

Every wait is bounded by ``--timeout-s`` (plus the lease where the lease must lapse first) and, on
time-out, says what it waited for and what it saw instead.

``--smoke``: a few steps, a short lease and 300 s phases, for tests/bench/test_recovery.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench import recovery_pause
from bench.report import finish
from training.components.loop import HOOKS_ENV
from training.demo.tiny_models import build_tiny_encoder
from contract.env import EXPECTED_GPUS_ENV, RUN_ID_ENV, WORKER_ID_ENV
from contract.paths import child_env

STEP_LINE = re.compile(r"\bstep (\d+)/(\d+)\b")
RESUME_SLACK_S = 30.0
SMOKE_PHASE_S = 300.0
"""--smoke bounds every phase by this (a tiny run's phase takes seconds to a minute on 2 cores)."""


def _env(**extra: str) -> dict[str, str]:
    env = child_env(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    for name in ("RAGPOOL_TEST_HOOKS", "RAGPOOL_HEALTH_TEST_FAULT", EXPECTED_GPUS_ENV, RUN_ID_ENV):
        env.pop(name, None)
    return env


def run_spec(run_id: str, args: argparse.Namespace) -> dict:
    from training.config.run import flatten
    from training.scheduler.spec import RUN_SECTION

    retriever = {"model": "models/tiny-encoder", "global_batch_size": 8, "max_steps": args.max_steps,
                 "hard_negatives": 1, "max_length": 32, "optim": {"lr": 1e-3, "warmup_steps": 2}}
    run_wide = {"device": "cpu", "checkpoint": {"every_steps": args.checkpoint_every, "keep_latest_k": 2},
                "metrics": {"port": 0, "log_every": 1}}
    return {"run_id": run_id, "stages": ["retriever"],
            "data": {"corpus": "datasets/synthetic/corpus.jsonl", "qa_train": "datasets/synthetic/qa_train.jsonl",
                     "qa_eval": "datasets/synthetic/qa_eval.jsonl"},
            "hyperparameters": {"retriever": flatten(retriever), RUN_SECTION: flatten(run_wide)},
            "gpus_per_node": args.nproc, "max_attempts": 3, "timeout_seconds": 3600}


def start_worker(name: str, out: Path, env: dict[str, str], args: argparse.Namespace) -> subprocess.Popen:
    log = open(out / f"worker-{name}.log", "wb")
    cmd = [sys.executable, "-m", "training.worker", "--lease-seconds", f"{args.lease_seconds:g}",
           "--poll-seconds", "0.5", "--idle-exit-seconds", "900", "--max-tasks", "1",
           "--health-check-timeout-seconds", "300", "--stop-grace-seconds", "30"]
    proc = subprocess.Popen(cmd, env={**env, WORKER_ID_ENV: name}, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (Linux /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def lose_node(worker: subprocess.Popen) -> float:
    """SIGKILL the worker, its process group and everything under it (torchrun and the ranks run
    in a session of their own); returns the time of the kill."""
    pids = descendants(worker.pid)
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    killed_at = time.time()
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait()
    return killed_at


def step_lines(path: Path) -> list[tuple[int, float | None]]:
    """(step, time) of every training-step line in a run log: the JSON lines' ``ts`` when the
    line is a JSON object (training/components/logs.py), else None."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        match = STEP_LINE.search(line)
        if not match:
            continue
        ts = None
        try:
            record = json.loads(line)
            ts = float(record["ts"]) if isinstance(record, dict) and "ts" in record else None
        except (ValueError, TypeError, KeyError):
            pass
        out.append((int(match.group(1)), ts))
    return out


def logged_steps(path: Path) -> list[int]:
    return [step for step, _ in step_lines(path)]


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.05, seen=None):
    """Poll ``predicate`` until it returns something true (returned) for at most ``timeout_s``;
    on time-out a TimeoutError names ``what`` and, when given, what ``seen()`` saw instead."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    instead = f"; saw instead: {seen()}" if seen is not None else ""
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{instead}")


def wait_exit(proc: subprocess.Popen, timeout_s: float, what: str) -> int:
    """``proc.wait`` bounded, with a message that names the process and its last log lines."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what} (pid {proc.pid}) to exit") from None


def resume_seen(log2: Path, info) -> tuple[str, object] | None:
    """What ends the wait for attempt 2: ``("step", lines)`` once its log has a training step,
    ``("complete", info)`` once the run ended without one (the kill came after the stage's last
    checkpoint, so attempt 2 had nothing left to train: a correct run that prints no step line),
    else None."""
    from training.scheduler.queue_records import TERMINAL_STATES

    lines = step_lines(log2)
    if lines:
        return "step", lines
    if info is not None and info.state in TERMINAL_STATES:
        return "complete", info
    return None


def describe(info) -> str:
    """A run's queue state in one line, for time-out messages."""
    if info is None:
        return "no such run in the queue"
    return (f"state={info.state} attempts={info.attempts} worker={info.worker or '-'} "
            f"last_error={info.last_error[-200:]!r}")


def final_params(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "retriever" / "model" / "model.safetensors"))


def measure(args: argparse.Namespace) -> dict:
    from training.localdev.redis_server import LocalRedisServer
    from training.scheduler.redis_conn import connect, settings_from_env
    from training.scheduler.run_queue import TaskQueue
    from training.scheduler.spec import parse_spec

    load_start = round(os.getloadavg()[0], 2)
    out = Path(args.out).resolve()
    shared = out / "shared"
    shutil.rmtree(shared / "runs", ignore_errors=True)
    (shared / "models").mkdir(parents=True, exist_ok=True)
    if not (shared / "datasets" / "synthetic" / "qa_train.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "training.demo.synthetic", "--out", str(shared / "datasets" / "synthetic")],
                       check=True, env=_env())
    build_tiny_encoder(shared / "models" / "tiny-encoder")

    server = LocalRedisServer(appendonly=True).start()
    workers: list[subprocess.Popen] = []
    try:
        env = _env(REDIS_URL=server.url, RAGPOOL_SHARED_ROOT=str(shared), RAGPOOL_QUEUE_NAMESPACE="bench-recovery")
        os.environ.update(REDIS_URL=server.url)
        queue = TaskQueue(connect(settings_from_env()), namespace="bench-recovery", lease_seconds=args.lease_seconds)

        def submit(run_id: str) -> None:
            queue.submit(parse_spec(run_spec(run_id, args), shared_root=str(shared)))

        def state(run_id: str):
            return queue.get(run_id)

        # 1. Reference: one worker, no fault.
        submit("reference")
        ref = start_worker("ref", out, env, args)
        workers.append(ref)
        wait_exit(ref, args.timeout_s, "the reference run's worker")
        assert state("reference").state == "succeeded", f"reference run: {describe(state('reference'))}"

        # 2. Two workers; the first attempt's ranks wait after --kill-at-step (bench/recovery_pause.py)
        # and the holder's node is lost there.
        pause_dir = out / "pause-interrupted"
        shutil.rmtree(pause_dir, ignore_errors=True)
        pair_env = {**env, HOOKS_ENV: recovery_pause.MODULE, recovery_pause.PAUSE_STEP_ENV: str(args.kill_at_step),
                    recovery_pause.PAUSE_DIR_ENV: str(pause_dir)}
        submit("interrupted")
        pair = {name: start_worker(name, out, pair_env, args) for name in ("a", "b")}
        workers.extend(pair.values())
        holder = wait_until(lambda: (state("interrupted").worker if state("interrupted").state == "running" else ""),
                            args.timeout_s, "a worker to claim the run", seen=lambda: describe(state("interrupted")))
        log1 = shared / "runs" / "interrupted" / "logs" / "attempt-1-node-0.log"

        def paused():
            info = state("interrupted")
            if info is not None and info.state != "running":
                raise RuntimeError(f"attempt 1 ended before pausing at step {args.kill_at_step}: {describe(info)}")
            return recovery_pause.all_paused(pause_dir, args.nproc)

        markers = wait_until(paused, args.timeout_s, f"attempt 1's {args.nproc} ranks to pause after step {args.kill_at_step}",
                            seen=lambda: (f"{describe(state('interrupted'))}; attempt 1 logged up to step "
                                          f"{max(logged_steps(log1), default=None)}"))
        killed_at = lose_node(pair[holder])
        last_before = int(markers[0]["step"])

        log2 = shared / "runs" / "interrupted" / "logs" / "attempt-2-node-0.log"
        kind, _ = wait_until(lambda: resume_seen(log2, state("interrupted")), args.lease_seconds + args.timeout_s,
                             "attempt 2's first training step or the run's end", poll_s=0.02,
                             seen=lambda: f"{describe(state('interrupted'))}; {log2.name} exists: {log2.exists()}")
        seen_at = time.time()
        already_complete = kind == "complete"
        resumed_at = None
        if not already_complete:
            first_ts = step_lines(log2)[0][1]
            # The step's own timestamp when the log carries one; else when the bench saw the line.
            resumed_at = first_ts if first_ts is not None else seen_at
        survivor = pair["b" if holder == "a" else "a"]
        wait_exit(survivor, args.timeout_s, "the surviving worker")
        info = state("interrupted")
        claimed_at = info.claimed_at  # attempt 2's claim
        stage_marker = json.loads((shared / "runs" / "interrupted" / "retriever" / "_COMPLETE").read_text())
        a, b = final_params(shared / "runs" / "reference"), final_params(shared / "runs" / "interrupted")
        match = a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    finally:
        for proc in workers:
            if proc.poll() is None:
                for pid in descendants(proc.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                proc.wait()
        server.stop()

    lost = last_before - int(stage_marker["resumed_from"])
    kill_to_claim = round(claimed_at - killed_at, 2) if claimed_at else None
    result = {
        "time_to_resume_s": round(resumed_at - killed_at, 2) if resumed_at is not None else None,
        "resumed_already_complete": already_complete,
        # Of which: waiting for the lease to expire and the claim, then the new attempt's start-up
        # (torchrun, imports, data, checkpoint load) to its first step.
        "kill_to_claim_s": kill_to_claim,
        "claim_to_first_step_s": round(resumed_at - claimed_at, 2) if claimed_at and resumed_at else None,
        "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
        "cpu_cores": os.cpu_count(),
        "lost_steps": lost,
        "checkpoint_interval_steps": args.checkpoint_every,
        "lease_seconds": args.lease_seconds,
        "final_params_match": bool(match),
        "killed_at_step": last_before,
        "resumed_from_step": int(stage_marker["resumed_from"]),
        "steps": int(stage_marker["steps"]),
        "attempts": info.attempts,
        "final_state": info.state,
        "nproc": args.nproc,
    }
    # With nothing left to train, the resume is the claim.
    resume_s = result["time_to_resume_s"] if not already_complete else kill_to_claim
    result["goals"] = {
        "lost_steps_within_one_interval": lost <= args.checkpoint_every,
        "resume_within_lease_plus_30s": resume_s is not None and resume_s <= args.lease_seconds + RESUME_SLACK_S,
        "final_params_match": result["final_params_match"],
    }
    return result


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".local/bench-recovery", help="work directory (default .local/bench-recovery)")
    p.add_argument("--lease-seconds", type=float, default=15.0, help="the workers' lease (default 15)")
    p.add_argument("--checkpoint-every", type=int, default=8, help="checkpoint interval in steps (default 8)")
    p.add_argument("--max-steps", type=int, default=32, help="steps of the run (default 32)")
    p.add_argument("--kill-at-step", type=int, default=None,
                   help="lose the holder once it logged this step (default: 5/8 into the third interval)")
    p.add_argument("--nproc", type=int, default=2, help="training processes per worker (default 2)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="limit for each phase (default 900)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run for tests: 8 steps, checkpoint every 3, lease 5 s, phases of at most 300 s")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.smoke:
        args.max_steps, args.checkpoint_every, args.lease_seconds = 8, 3, min(args.lease_seconds, 5.0)
        args.timeout_s = min(args.timeout_s, SMOKE_PHASE_S)
    if args.kill_at_step is None:
        args.kill_at_step = min(args.max_steps - 1, 2 * args.checkpoint_every + max(1, (5 * args.checkpoint_every) // 8))
    problems = []
    if args.checkpoint_every < 1 or args.max_steps < 2 or args.nproc < 1 or args.lease_seconds <= 0:
        problems.append("--checkpoint-every, --nproc and --lease-seconds must be positive, --max-steps at least 2")
    if not 0 < args.kill_at_step < args.max_steps:
        problems.append(f"--kill-at-step must be in [1, {args.max_steps - 1}]")
    return finish("bench.recovery", problems, lambda: measure(args))


if __name__ == "__main__":
    sys.exit(main())
