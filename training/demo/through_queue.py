"""The local main job through the queue, no cloud: ``make demo`` calls this.

    python -m training.demo.through_queue [--out .local/demo] [--nproc 2] [--run-id demo]
        [--executors torchrun,ray] [--tune-trials 4]

1. generates the synthetic dataset under ``<out>/shared/datasets/synthetic``
   (``python -m training.demo.synthetic``) and removes its own previous runs there (``runs/<run id>``,
   ``runs/demo-ray``, ``runs/demo-tune``): each demo trains afresh;
2. starts a local ``redis-server`` on 127.0.0.1 (free port, AOF on, data in a temp dir);
3. ``ragpool submit`` of the demo run spec (all four stages, ``--nproc`` processes, sized
   like ``python -m training.demo``, whose config it reuses);
4. runs one worker (``RAGPOOL_EXECUTORS=torchrun python -m training.worker``), which runs the
   pipeline with ``torchrun --nproc-per-node=<nproc>`` and exits once the queue is empty;
5. shows ``ragpool status`` and the run's artifacts;
6. with ``ray`` among ``--executors``: the same run with ``executor: ray`` through the queue on a
   local Ray head (launched before step 3, so it comes up while the torchrun run trains), then a
   Ray Tune search of ``--tune-trials`` trials printing its trial table (:mod:`training.demo.ray_queue`);
7. stops Ray and Redis (also on Ctrl-C or failure).

Exit code 0 when every run succeeded, 1 when one did not, 2 when redis-server is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from contract import exit_codes
from contract.env import EXECUTORS_ENV, NAMESPACE_ENV
from contract.lanes import Executor
from training.demo.direct import demo_spec


def run_worker(env: dict[str, str], grace_s: float = 60.0) -> int:
    """One queue worker (``python -m training.worker``) until the queue is empty; its exit code.

    On Ctrl-C the worker got SIGINT too (same process group): it stops its run (a Ray job is
    stopped) and hands the run back; it gets ``grace_s`` for that before it is killed."""
    worker = subprocess.Popen([sys.executable, "-m", "training.worker", "--idle-exit-seconds", "0",
                               "--lease-seconds", "30", "--poll-seconds", "0.5"], env=env)
    try:
        return worker.wait()
    except KeyboardInterrupt:
        try:
            worker.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        raise


def _torchrun_run(run_id: str, spec_path: Path, shared: Path, env: dict[str, str]) -> int:
    """Steps 3-5: submit the torchrun run, one worker, status, report and artifacts; 0 when it succeeded."""
    from training.demo.direct import artifact_paths
    from training.reports.report import ReportError, render
    from training.scheduler import cli as runs_cli
    from training.scheduler.redis_conn import connect
    from training.scheduler.run_queue import TaskQueue

    print(f"== ragpool submit {spec_path}", flush=True)
    code = runs_cli.main(["submit", str(spec_path)])
    if code != 0:
        return code
    print("== one worker: RAGPOOL_EXECUTORS=torchrun python -m training.worker --idle-exit-seconds 0", flush=True)
    print(f"== worker exited {run_worker(env)}", flush=True)
    print("== ragpool status", flush=True)
    runs_cli.main(["status"])
    print(f"\n== ragpool status {run_id}", flush=True)
    runs_cli.main(["status", run_id])
    info = TaskQueue(connect(), namespace=env[NAMESPACE_ENV]).get(run_id)
    paths = artifact_paths(shared / "runs" / run_id)
    report = Path(paths["report"])
    if report.is_file():
        print(f"\n== evaluation report ({report})")
        print(report.read_text().rstrip())
    try:
        paths["report_html"] = str(render(shared, run_id))
    except ReportError as exc:
        print(f"\n== no run report: {exc}")
    print("\n== artifacts")
    for label, path in paths.items():
        print(f"  {label:<16} {path}{'' if Path(path).exists() else '  (missing)'}")
    return 0 if info is not None and info.state == "succeeded" else 1


def remove_previous_runs(shared: Path, run_ids: list[str]) -> list[Path]:
    """Remove ``runs/<id>`` under ``shared`` for each of the demo's run ids; returns those removed.

    Each demo starts its runs afresh: a previous demo's runs (maybe made with other settings, which
    the pipeline refuses to resume, or complete, which it would skip) are this command's own outputs.
    """
    from contract.paths import run_dir

    removed = []
    for run_id in run_ids:
        previous = run_dir(shared, run_id)
        if previous.exists():
            shutil.rmtree(previous)
            removed.append(previous)
    return removed


def main(argv: list[str] | None = None) -> int:
    from training.localdev.redis_server import LocalRedisServer, RedisServerError

    parser = argparse.ArgumentParser(prog="python -m training.demo.through_queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".local/demo", help="where the shared root and spec go (default .local/demo)")
    parser.add_argument("--nproc", type=int, default=2, help="processes per node for torchrun (default 2)")
    parser.add_argument("--run-id", default="demo", help="run id (default demo)")
    parser.add_argument("--executors", default="torchrun,ray",
                        help="which runs to make: torchrun, ray, or both (default torchrun,ray)")
    parser.add_argument("--tune-trials", type=int, default=4,
                        help="trials of the Ray Tune search after the ray run (default 4; 0 skips it)")
    args = parser.parse_args(argv)
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    if not executors or set(executors) - {"torchrun", "ray"}:
        parser.error(f"--executors={args.executors!r}: a comma-separated list of torchrun and ray")
    if not 0 <= args.tune_trials <= 64:
        parser.error(f"--tune-trials={args.tune_trials}: must be in [0, 64]")

    out = Path(args.out).resolve()
    shared = out / "shared"
    data = shared / "datasets" / "synthetic"
    from contract.paths import child_env

    env = child_env()

    if not (data / "qa_eval.jsonl").is_file():
        print(f"== generating the synthetic dataset in {data}", flush=True)
        subprocess.run([sys.executable, "-m", "training.demo.synthetic", "--out", str(data)], check=True, env=env)
    import yaml

    ids = [args.run_id] * ("torchrun" in executors)
    if "ray" in executors:
        from training.demo.ray_queue import RAY_RUN_ID, TUNE_RUN_ID

        ids += [RAY_RUN_ID, TUNE_RUN_ID]
    for previous in remove_previous_runs(shared, ids):
        print(f"== removed the previous demo run {previous}", flush=True)

    spec_path = out / f"{args.run_id}.yaml"
    spec_path.write_text(yaml.safe_dump(demo_spec(args.run_id, args.nproc, shared), sort_keys=False))

    try:
        server = LocalRedisServer(appendonly=True).start()
    except RedisServerError as exc:
        print(f"local_demo: {exc}", file=sys.stderr)
        return exit_codes.UNAVAILABLE
    try:
        env.update(REDIS_URL=server.url, RAGPOOL_SHARED_ROOT=str(shared), RAGPOOL_QUEUE_NAMESPACE="ragpool")
        os.environ.update(REDIS_URL=server.url, RAGPOOL_SHARED_ROOT=str(shared), RAGPOOL_QUEUE_NAMESPACE="ragpool")
        print(f"== redis-server on {server.url} (data {server.data_dir})", flush=True)
        ok = True
        head = None
        try:
            if "ray" in executors:
                from training.demo import ray_queue
                from training.localdev.ray_head import RayHeadError

                try:  # the Ray head comes up while the torchrun run trains (ray_queue.run waits for it)
                    head = ray_queue.launch_head()
                except RayHeadError:
                    head = None  # ray_queue.run reports it
            if "torchrun" in executors:
                ok = _torchrun_run(args.run_id, spec_path, shared, {**env, EXECUTORS_ENV: Executor.TORCHRUN.value}) == 0
            if "ray" in executors:
                ok = ray_queue.run(out, shared, env, run_worker, tune_trials=args.tune_trials, head=head) == 0 and ok
                head = None  # stopped by ray_queue.run
        finally:
            if head is not None:
                head.stop()
        return 0 if ok else 1
    finally:
        server.stop()
        print("== redis-server stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
