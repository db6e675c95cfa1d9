"""The local main job through the queue, no cloud: ``make demo`` calls this.

    python -m training.demo.through_queue [--out .local/demo] [--nproc 2] [--run-id demo]

1. generates the synthetic dataset under ``<out>/shared/datasets/synthetic``
   (``python -m training.demo.synthetic``);
2. starts a local ``redis-server`` on 127.0.0.1 (free port, AOF on, data in a temp dir);
3. ``ragpool submit`` of the demo run spec (all four stages, ``--nproc`` processes, sized
   like ``python -m training.demo``, whose config it reuses);
4. runs one worker (``python -m training.worker``), which runs the pipeline with
   ``torchrun --nproc-per-node=<nproc>`` and exits once the queue is empty;
5. shows ``ragpool status`` and the run's artifacts;
6. stops Redis (also on Ctrl-C or failure).

Exit code 0 when the run succeeded, 1 when it did not, 2 when redis-server is missing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def demo_spec(run_id: str, nproc: int, shared: Path) -> dict:
    """The demo run as a run spec, sized like ``python -m training.demo`` (its config is the one source)."""
    from training.config import flatten
    from training.demo.direct import demo_config
    from training.config import STAGES
    from training.scheduler.spec import RUN_SECTION

    config = demo_config(shared, run_id)
    stages = [s for s in STAGES if s in config["stages"]]
    hyper = {stage: flatten(config[stage]) for stage in stages if config.get(stage)}
    run_wide = {k: v for k, v in config.items()
                if k not in ("run_id", "shared_root", "stages", "data", *STAGES)}
    if run_wide:
        hyper[RUN_SECTION] = flatten(run_wide)
    return {"run_id": run_id, "stages": stages, "data": config["data"], "hyperparameters": hyper,
            "gpus_per_node": nproc, "priority": "normal", "max_attempts": 2, "timeout_seconds": 1800}


def main(argv: list[str] | None = None) -> int:
    from training.scheduler import cli as runs_cli
    from training.demo.redis_server import LocalRedisServer, RedisServerError

    parser = argparse.ArgumentParser(prog="python -m training.demo.through_queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".local/demo", help="where the shared root and spec go (default .local/demo)")
    parser.add_argument("--nproc", type=int, default=2, help="processes per node for torchrun (default 2)")
    parser.add_argument("--run-id", default="demo", help="run id (default demo)")
    args = parser.parse_args(argv)

    out = Path(args.out).resolve()
    shared = out / "shared"
    data = shared / "datasets" / "synthetic"
    package_root = str(Path(__file__).resolve().parents[2])  # the repository: `training` is importable
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)

    if not (data / "qa_eval.jsonl").is_file():
        print(f"== generating the synthetic dataset in {data}", flush=True)
        subprocess.run([sys.executable, "-m", "training.demo.synthetic", "--out", str(data)], check=True, env=env)
    import yaml

    spec_path = out / f"{args.run_id}.yaml"
    spec_path.write_text(yaml.safe_dump(demo_spec(args.run_id, args.nproc, shared), sort_keys=False))

    try:
        server = LocalRedisServer(appendonly=True).start()
    except RedisServerError as exc:
        print(f"local_demo: {exc}", file=sys.stderr)
        return 2
    try:
        env.update(REDIS_URL=server.url, RAGPOOL_SHARED_ROOT=str(shared), RAGPOOL_QUEUE_NAMESPACE="ragpool")
        os.environ.update(REDIS_URL=server.url, RAGPOOL_SHARED_ROOT=str(shared), RAGPOOL_QUEUE_NAMESPACE="ragpool")
        print(f"== redis-server on {server.url} (data {server.data_dir})", flush=True)
        print(f"== ragpool submit {spec_path}", flush=True)
        code = runs_cli.main(["submit", str(spec_path)])
        if code != 0:
            return code
        print("== one worker: python -m training.worker --idle-exit-seconds 0", flush=True)
        worker = subprocess.run([sys.executable, "-m", "training.worker", "--idle-exit-seconds", "0",
                                 "--lease-seconds", "30", "--poll-seconds", "0.5"], env=env)
        print(f"== worker exited {worker.returncode}", flush=True)
        print("== ragpool status", flush=True)
        runs_cli.main(["status"])
        print(f"\n== ragpool status {args.run_id}", flush=True)
        runs_cli.main(["status", args.run_id])
        from training.scheduler.run_queue import TaskQueue
        from training.scheduler.redis_conn import connect

        info = TaskQueue(connect(), namespace="ragpool").get(args.run_id)
        from training.demo.direct import artifact_paths

        paths = artifact_paths(shared / "runs" / args.run_id)
        report = Path(paths["report"])
        if report.is_file():
            print(f"\n== evaluation report ({report})")
            print(report.read_text().rstrip())
        from training.reports.report import ReportError, render

        try:
            paths["report_html"] = str(render(shared, args.run_id))
        except ReportError as exc:
            print(f"\n== no run report: {exc}")
        print("\n== artifacts")
        for label, path in paths.items():
            print(f"  {label:<16} {path}{'' if Path(path).exists() else '  (missing)'}")
        return 0 if info is not None and info.state == "succeeded" else 1
    finally:
        server.stop()
        print("== redis-server stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
