"""The local main job through the queue, no cloud: ``make demo`` calls this.

    python -m training.demo.through_queue [--out .local/demo] [--nproc 2] [--run-id demo]
        [--executors torchrun,ray] [--tune-trials 4]

1. generates the synthetic dataset under ``<out>/shared/datasets/synthetic``
   (``python -m training.demo.synthetic``) and removes its own previous runs there (``runs/<run id>``,
   ``runs/demo-ray``, ``runs/demo-tune``): each demo trains afresh;
2. starts a local ``redis-server`` on 127.0.0.1 (free port, AOF on, data in a temp dir), and in front of it
   the run API as a laptop reaches it (:func:`through_run_api`): a local STS (moto, 127.0.0.1) with a local
   IAM user, the real API (training/localdev/run_api.py) mapping that user to team ``demo``, and
   ``ragpool login --endpoint`` into a temporary context file; from then on this process's environment is a
   laptop's (that user's AWS keys, no ``REDIS_URL``), so every ``ragpool`` command below goes through the API
   as that user, while the workers get Redis directly, as in the cluster;
3. ``ragpool submit`` of the demo run spec (all four stages, ``--nproc`` processes, sized
   like ``python -m training.demo``, whose config it reuses);
4. runs one worker (``RAGPOOL_EXECUTORS=torchrun python -m training.worker``), which runs the
   pipeline with ``torchrun --nproc-per-node=<nproc>`` and exits once the queue is empty;
5. shows ``ragpool status``, the evaluation stage's ``ragpool logs``, ``ragpool report`` and the run's artifacts;
6. with ``ray`` among ``--executors``: the same run with ``executor: ray`` through the queue on a
   local Ray head (launched before step 3, so it comes up while the torchrun run trains), then a
   Ray Tune search of ``--tune-trials`` trials printing its trial table (:mod:`training.demo.ray_queue`; its
   ``submit`` and ``status`` go through the API too; ``ragpool tune`` drives the local Ray cluster itself, on
   the direct path);
7. stops Ray, the API, the STS and Redis (also on Ctrl-C or failure); the API's audit trail stays in
   ``<out>/run-api-audit.jsonl``.

Exit code 0 when every run succeeded, 1 when one did not, 2 when redis-server is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from contract import exit_codes
from contract.env import CONFIG_ENV, CONTEXT_ENV, EXECUTORS_ENV, NAMESPACE_ENV, REDIS_URL_ENV
from contract.lanes import Executor
from training.demo.direct import demo_spec

CLUSTER_ID = "ragpool-local"
"""The cluster id the local run API serves (``ragpool login --cluster-id``)."""
DEMO_USER = "ml-engineer"
"""The local IAM user the demo signs in as."""
DEMO_TEAM = "demo"
"""The team the API maps that user to."""
AUDIT_FILE = "run-api-audit.jsonl"
"""The API's audit lines, under ``--out``."""


class LoginFailed(RuntimeError):
    """``ragpool login`` against the local run API failed (the message says how)."""


@dataclass
class Laptop:
    """The run API as :func:`through_run_api` serves it, and who this process is signed in as."""
    endpoint: str
    arn: str
    api: object
    """The ``training.api.server.RunApi``: ``api.queue`` is the queue it serves (Redis directly)."""
    audit_path: Path


def ragpool(*argv: str) -> int:
    """A ``ragpool`` command, in this process: the run, login and logs/report commands of the ``ragpool`` CLI."""
    from training.api import cli as api_cli
    from training.reports import cli as reports_cli
    from training.scheduler import cli as runs_cli

    parser = argparse.ArgumentParser(prog="ragpool")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (runs_cli, api_cli, reports_cli):
        module.register(subparsers)
    args = parser.parse_args(list(argv))
    sys.stdout.flush()
    code = int(args.handler(args) or 0)
    sys.stdout.flush()
    return code


@contextmanager
def through_run_api(redis_server, namespace: str, shared: Path, out: Path) -> Iterator[Laptop]:
    """Step 2 of the module docstring: the run API on ``redis_server`` (a ``LocalRedisServer``; queue key
    namespace ``namespace``, shared root ``shared``), a local STS and its IAM user :data:`DEMO_USER`, and this
    process signed in as that user with ``ragpool login --endpoint`` (a temporary context file; the user's
    AWS keys; no ``REDIS_URL``) until the block ends, when the environment is restored and all of it stops.
    Raises :class:`LoginFailed` when the login fails."""
    from training.localdev.run_api import local_run_api
    from training.localdev.sts_server import sts_server
    from training.scheduler.run_queue import TaskQueue

    import logging

    audit_path = out / AUDIT_FILE
    client = redis_server.client()
    requests_log = logging.getLogger("werkzeug")  # the local STS's access log: not the demo's story
    level = requests_log.level
    requests_log.setLevel(logging.WARNING)
    try:
        with sts_server() as sts, audit_path.open("w") as audit, tempfile.TemporaryDirectory(prefix="ragpool-laptop-") as home:
            user = sts.user(DEMO_USER)
            teams = {"teams": {DEMO_TEAM: [user.arn]}}
            with local_run_api(TaskQueue(client, namespace=namespace), sts_endpoint=sts.endpoint,
                               cluster_id=CLUSTER_ID, teams=teams, shared_root=str(shared),
                               audit_stream=audit) as (endpoint, api), mock.patch.dict(os.environ):
                for name in (REDIS_URL_ENV, CONTEXT_ENV, NAMESPACE_ENV, "AWS_PROFILE"):
                    os.environ.pop(name, None)
                os.environ.update(user.env(str(Path(home) / "no-aws-config")))
                os.environ[CONFIG_ENV] = str(Path(home) / "contexts.yaml")
                print(f"== ragpool login --endpoint {endpoint}  (local STS {sts.endpoint}, IAM user {user.arn})",
                      flush=True)
                code = ragpool("login", "--endpoint", endpoint, "--cluster-id", CLUSTER_ID)
                if code != 0:
                    raise LoginFailed(f"ragpool login --endpoint {endpoint} exited {code}")
                print(f"== through the run API at {endpoint} as {user.arn}", flush=True)
                yield Laptop(endpoint, user.arn, api, audit_path)
    finally:
        client.close()
        requests_log.setLevel(level)


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


def _torchrun_run(run_id: str, spec_path: Path, shared: Path, env: dict[str, str], laptop: Laptop) -> int:
    """Steps 3-5: submit the torchrun run, one worker, status, logs, report and artifacts; 0 when it succeeded."""
    from contract.paths import run_dir
    from training.demo.direct import artifact_paths

    print(f"== ragpool submit {spec_path}", flush=True)
    code = ragpool("submit", str(spec_path))
    if code != 0:
        return code
    print("== one worker: RAGPOOL_EXECUTORS=torchrun python -m training.worker --idle-exit-seconds 0", flush=True)
    print(f"== worker exited {run_worker(env)}", flush=True)
    print("== ragpool status", flush=True)
    ragpool("status")
    print(f"\n== ragpool status {run_id}", flush=True)
    ragpool("status", run_id)
    print(f"\n== ragpool logs {run_id} --stage evaluate  (it ends with the evaluation report)", flush=True)
    logs_code = ragpool("logs", run_id, "--stage", "evaluate")
    info = laptop.api.queue.get(run_id)
    paths = artifact_paths(run_dir(shared, run_id))
    report = Path(paths["report"])
    if report.is_file() and logs_code != 0:
        print(f"\n== evaluation report ({report})")
        print(report.read_text().rstrip())
    html = run_dir(shared, run_id) / "report.html"
    print(f"\n== ragpool report {run_id} --out {html}", flush=True)
    if ragpool("report", run_id, "--out", str(html)) == 0:
        paths["report_html"] = str(html)
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
        # The workers' environment: Redis directly, as in the cluster (the laptop's commands go through the API).
        env.update(REDIS_URL=server.url, RAGPOOL_SHARED_ROOT=str(shared), RAGPOOL_QUEUE_NAMESPACE="ragpool")
        print(f"== redis-server on {server.url} (data {server.data_dir})", flush=True)
        ok = True
        head = None
        with ExitStack() as stack:
            try:
                laptop = stack.enter_context(through_run_api(server, env[NAMESPACE_ENV], shared, out))
            except LoginFailed as exc:
                print(f"local_demo: {exc}", file=sys.stderr)
                return exit_codes.UNAVAILABLE
            try:
                if "ray" in executors:
                    from training.demo import ray_queue
                    from training.localdev.ray_head import RayHeadError

                    try:  # the Ray head comes up while the torchrun run trains (ray_queue.run waits for it)
                        head = ray_queue.launch_head()
                    except RayHeadError:
                        head = None  # ray_queue.run reports it
                if "torchrun" in executors:
                    ok = _torchrun_run(args.run_id, spec_path, shared, {**env, EXECUTORS_ENV: Executor.TORCHRUN.value},
                                       laptop) == 0
                if "ray" in executors:
                    ok = ray_queue.run(out, shared, env, run_worker, tune_trials=args.tune_trials, head=head) == 0 and ok
                    head = None  # stopped by ray_queue.run
            finally:
                if head is not None:
                    head.stop()
            print(f"== the run API's audit trail: {laptop.audit_path}", flush=True)
        return 0 if ok else 1
    finally:
        server.stop()
        print("== redis-server stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
