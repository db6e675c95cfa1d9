"""The pre-flight health check's GPU path, timed: what a worker pays before it claims a run.

    python -m bench.gpu_health [--expected-gpus N] [--matmul-size 4096] [--repeats 3]

Runs ``python -m training.components.health`` (the command the worker runs,
training/scheduler/worker/preflight.py) ``--repeats`` times as a subprocess on this machine's GPUs, and
prints per run: the wall time of the whole command (interpreter, torch import, CUDA init
included), each check's seconds and detail (matmul ms/product and TFLOP/s per GPU, the NCCL
all-reduce with two or more GPUs). One JSON line last: ``{"gpus", "gpu_names", "runs": [...],
"wall_s": {"min", "median", "max"}, "ok"}``. Exit 0 when every run passed, 1 otherwise.

On a machine without CUDA it refuses (exit 2): the CPU path is tested in
tests/training/components/test_health.py; this bench is for the GPU path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from contract import exit_codes
from contract.paths import child_env



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_health", description=__doc__.split("\n\n")[0])
    p.add_argument("--expected-gpus", type=int, default=None, help="GPUs that must be visible (default: all visible)")
    p.add_argument("--matmul-size", type=int, default=4096, help="N of the N x N matmul per GPU (default 4096)")
    p.add_argument("--time-limit-seconds", type=float, default=60.0, help="per-check limit (default 60)")
    p.add_argument("--repeats", type=int, default=3, help="runs of the whole command (default 3)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.matmul_size < 1:
        print("bench.gpu_health: --repeats and --matmul-size must be at least 1", file=sys.stderr)
        return exit_codes.BAD_INPUT

    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("bench.gpu_health: no CUDA device here; this bench times the GPU path of the pre-flight check "
              "(run it on a GPU node; the CPU path is covered by tests/training/components/test_health.py)",
              file=sys.stderr)
        return exit_codes.BAD_INPUT
    gpus = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    expected = args.expected_gpus if args.expected_gpus is not None else gpus

    env = child_env()
    env.pop("RAGPOOL_HEALTH_TEST_FAULT", None)
    cmd = [sys.executable, "-m", "training.components.health", "--expected-gpus", str(expected),
           "--matmul-size", str(args.matmul_size), "--time-limit-seconds", f"{args.time_limit_seconds:g}"]
    runs = []
    for i in range(args.repeats):
        started = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - started
        sys.stderr.write(out.stderr)
        try:
            report = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            report = {"ok": False, "checks": [], "error": out.stderr[-1000:]}
        runs.append({"run": i, "exit_code": out.returncode, "wall_s": round(wall, 3), "ok": bool(report.get("ok")),
                     "checks": report.get("checks", [])})
        print(f"run {i}: exit {out.returncode}, {wall:.2f}s", file=sys.stderr)
    walls = [r["wall_s"] for r in runs]
    result = {"gpus": gpus, "gpu_names": names, "expected_gpus": expected, "matmul_size": args.matmul_size,
              "runs": runs, "wall_s": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)},
              "ok": all(r["ok"] for r in runs)}
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
