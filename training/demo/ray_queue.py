"""The Ray half of ``make demo``: the demo run with ``executor: ray`` through the queue, then a Tune search.

:func:`run` is called by :mod:`training.demo.through_queue` (``--executors torchrun,ray``) while its
local redis-server runs, after the torchrun run:

1. starts a local Ray head (:class:`training.localdev.ray_head.LocalRayHead`: ``ray start --head`` on free
   ports with the Jobs API and Ray token authentication, 2 logical CPUs, node label ``ragpool.io/pool=gpu-spot`` standing in for the
   GPU pool of a real cluster), or waits for the one :func:`launch_head` began (``make demo`` launches
   it before its torchrun run, so the head's ~15 s start-up overlaps that run);
2. ``ragpool submit`` of the demo run as ``executor: ray`` (through the run API: ``make demo`` signed in; run
   id ``demo-ray``: the same data and stages, fewer steps; every stage placed on pool ``gpu-spot``, two Ray Train workers per training
   stage, two index tasks);
3. one worker with ``RAGPOOL_EXECUTORS=ray``, ``RAY_ADDRESS=<the head's Jobs API>`` and the head's token
   (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``) claims it and runs ``python -m training.ray.job``,
   which submits the Ray driver as a Ray job and follows it, sending the token on every call;
4. ``ragpool tune`` of a retriever search (run id ``demo-tune``: 4 trials, ASHA over learning rate,
   temperature and batch size, two trials at once), which prints the trial table and writes it with the
   best configuration under ``runs/demo-tune/tune/``;
5. stops the Ray head (also on Ctrl-C or failure).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from contract import exit_codes
from contract.env import EXECUTORS_ENV, NAMESPACE_ENV
from contract.lanes import Executor
from training.demo.direct import demo_spec

RAY_RUN_ID = "demo-ray"
TUNE_RUN_ID = "demo-tune"
POOL = "gpu-spot"
"""The pool the local Ray node stands in for (the default GPU pool's name in the stacks)."""
RAY_CPUS = 2
"""Logical CPUs of the local Ray node (the demo's 2 cores)."""


def ray_demo_spec(shared: Path, run_id: str = RAY_RUN_ID, pool: str = POOL) -> dict[str, Any]:
    """The demo run (:func:`training.demo.direct.demo_config`) as an ``executor: ray`` spec, sized for
    about two and a half minutes on 2 cores (mostly Ray Train start-ups): fewer steps, each stage on ``pool``
    (2 CPUs: 2 Ray Train workers of 1 CPU, 2 index and 2 preparation tasks)."""
    stage = {"pool": pool}
    overrides = {
        "retriever": {"max_steps": 8},
        "generator": {"max_steps": 20, "optim": {"warmup_steps": 2}},
        "evaluate": {"compare_pretrained": False},
        "ray": {"placement_timeout_s": 120, "max_failures": 1,
                "prepare": {**stage, "workers": 2}, "retriever": {**stage, "workers": 2},
                "index": {**stage, "workers": 2}, "generator": {**stage, "workers": 2}, "evaluate": stage},
    }
    spec = demo_spec(run_id, None, shared, overrides=overrides)
    spec.update(executor="ray", max_attempts=1, timeout_seconds=1200)
    return spec


def tune_demo_spec(shared: Path, trials: int = 4, run_id: str = TUNE_RUN_ID, pool: str = POOL) -> dict[str, Any]:
    """A retriever search over the demo data: ``trials`` trials of 2 steps, ASHA milestones at 1 and 2,
    each trial one Ray Train worker of 0.9 CPU so that two run at once on the 2 logical CPUs."""
    overrides = {
        "stages": ["retriever"],
        "retriever": {"max_steps": 2, "optim": {"warmup_steps": 1}},
        "ray": {"placement_timeout_s": 120, "max_failures": 1,
                "prepare": {"pool": pool, "workers": 1}, "retriever": {"pool": pool, "workers": 1, "cpus": 0.9},
                "tune": {"num_samples": trials, "rungs": 2, "lr": [1.0e-5, 2.0e-4], "temperature": [0.02, 0.1],
                         "global_batch_size": [8, 16], "metric": "mrr", "eval_questions": 20}},
    }
    spec = demo_spec(run_id, None, shared, overrides=overrides)
    spec.update(executor="ray", max_attempts=1)
    return spec


def _write(path: Path, spec: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def launch_head() -> Any:
    """Step 1 begun: the local head (:class:`training.localdev.ray_head.LocalRayHead`) launched, not yet
    waited for, so that it comes up while the demo's torchrun run trains; :func:`run` waits for it."""
    from training.localdev.ray_head import LocalRayHead

    return LocalRayHead(num_cpus=RAY_CPUS, pool=POOL).launch()


def run(out: Path, shared: Path, env: dict[str, str], run_worker, tune_trials: int = 4, head: Any = None) -> int:
    """Steps 1-5 of the module docstring; ``env`` is the demo's environment (Redis, shared root) and
    ``run_worker(env)`` runs one queue worker to an empty queue; ``head`` is a head from
    :func:`launch_head` (else one is started here); it is stopped here in every case.
    0 when the run and the search succeeded."""
    from training.localdev.ray_head import USAGE_STATS_ENV, RayHeadError
    from contract.ray_pools import POOLS_ENV
    from training.scheduler import cli as runs_cli
    from training.scheduler.redis_conn import connect, settings_from_env
    from training.scheduler.run_queue import TaskQueue

    ray_spec = _write(out / f"{RAY_RUN_ID}.yaml", ray_demo_spec(shared))
    tune_spec = _write(out / f"{TUNE_RUN_ID}.yaml", tune_demo_spec(shared, tune_trials)) if tune_trials else None
    pools = f"{POOL}=0"  # the local node stands in for pool gpu-spot, with no GPUs
    os.environ[POOLS_ENV] = pools  # `ragpool submit` (in this process) checks ray runs against it
    print(f"\n== local Ray head (ray start --head, {RAY_CPUS} CPUs, node label ragpool.io/pool={POOL})", flush=True)
    t0 = time.monotonic()
    try:
        head = head or launch_head()
        head.wait_ready()  # stops the head when it fails
    except RayHeadError as exc:
        print(f"local_demo: {exc}", file=sys.stderr)
        return exit_codes.UNAVAILABLE
    try:
        print(f"== Ray Jobs API on {head.address} (cluster {head.gcs_address}; waited {time.monotonic() - t0:.0f}s for it)",
              flush=True)
        # The head runs with token authentication: its clients (the worker's Ray job, ragpool tune) get its token file.
        ray_env = {**env, POOLS_ENV: pools, **head.client_env(), USAGE_STATS_ENV: "0"}
        print(f"== ragpool submit {ray_spec}  (executor: ray)", flush=True)
        code = runs_cli.main(["submit", str(ray_spec)])
        if code != 0:
            return code
        print("== one Ray worker: RAGPOOL_EXECUTORS=ray RAY_ADDRESS=" + head.address
              + " " + " ".join(f"{k}={v}" for k, v in head.client_env().items())
              + " python -m training.worker --idle-exit-seconds 0", flush=True)
        worker_code = run_worker({**ray_env, EXECUTORS_ENV: Executor.RAY.value, "RAY_ADDRESS": head.address})
        print(f"== Ray worker exited {worker_code}", flush=True)
        print(f"\n== ragpool status {RAY_RUN_ID}", flush=True)
        runs_cli.main(["status", RAY_RUN_ID])
        # The verdict from the workers' Redis (``env``): this process may be a laptop with no REDIS_URL.
        info = TaskQueue(connect(settings_from_env(env)), namespace=env[NAMESPACE_ENV]).get(RAY_RUN_ID)
        report = shared / "runs" / RAY_RUN_ID / "evaluate" / "report.json"
        print(f"== Ray run artifacts: {shared / 'runs' / RAY_RUN_ID}  (report {report}"
              f"{'' if report.is_file() else ', missing'})", flush=True)
        ok = info is not None and info.state == "succeeded"
        if not ok and head.process is not None and head.process.poll() is not None:
            print(f"== the Ray head exited {head.process.returncode}:\n{head.log_tail()}", flush=True)
        if tune_spec is not None:
            print(f"\n== ragpool tune {tune_spec}  ({tune_trials} trials, ASHA; Ray cluster {head.gcs_address})",
                  flush=True)
            tune = subprocess.run([sys.executable, "-m", "training.scheduler.cli", "tune", str(tune_spec)],
                                  env={**ray_env, "RAY_ADDRESS": head.gcs_address})
            table = shared / "runs" / TUNE_RUN_ID / "tune" / "trials.txt"
            print(f"== ragpool tune exited {tune.returncode}; trial table {table}, best config "
                  f"{table.with_name('best.yaml')}", flush=True)
            ok = ok and tune.returncode == 0
        return 0 if ok else 1
    finally:
        head.stop()
        print("== Ray head stopped", flush=True)
