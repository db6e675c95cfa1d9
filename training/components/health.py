"""Pre-flight node health check: run before a worker claims a run (a small "deep health check").

    python -m training.components.health [--expected-gpus N] [--matmul-size 1024]
                                         [--time-limit-seconds 60] [--allreduce auto|off|gloo]

Checks, in order; every check runs even after one failed, so the report is complete:

- ``gpus_visible``: the GPUs this process sees equal the GPUs it was given (``--expected-gpus``,
  default ``$RAGPOOL_EXPECTED_GPUS``, which the worker Job sets to its ``nvidia.com/gpu``
  request). Unset or 0 and no CUDA: the CPU path.
- ``matmul:<device>``: per GPU (on the CPU path: the CPU) an ``N x N`` float32 matmul of
  integer-valued matrices, whose exact product is known (a float64 product on the CPU; TF32
  off, so every partial sum is an integer float32 holds exactly). A single wrong element
  (silent data corruption) fails it, and so does a product slower than the time limit.
- ``allreduce``: with two or more local GPUs, one process per GPU joins an NCCL group
  and all-reduces a tensor; each rank must see the exact sum within the time limit.
  ``--allreduce gloo --ranks R`` runs the same collective over gloo on the CPU (tests).

Prints a readable line per check on stderr and one JSON object last on stdout
(``{"ok", "device", "gpus_expected", "gpus_visible", "checks": [{"name", "ok", "seconds",
"detail"}]}``). Exit codes (contract/exit_codes.py): ``OK``, ``HEALTH_CHECK_FAILED``, ``BAD_INPUT``.

A GPU that hangs cannot be interrupted from inside the process: the worker runs this command
as a subprocess with a timeout (training/scheduler/worker/preflight.py) and counts a timeout as a
failure.

Test hook (never set it in a Job): ``RAGPOOL_HEALTH_TEST_FAULT=matmul`` corrupts one element of
each product, ``=allreduce`` makes rank 0 contribute a wrong value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from contract import exit_codes
from contract.env import EXPECTED_GPUS_ENV

TEST_FAULT_ENV = "RAGPOOL_HEALTH_TEST_FAULT"
TEST_FAULTS = ("matmul", "allreduce")


@dataclass
class CheckResult:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class HealthReport:
    ok: bool
    device: str
    gpus_expected: int | None
    gpus_visible: int
    checks: list[CheckResult] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _test_fault() -> str | None:
    fault = os.environ.get(TEST_FAULT_ENV) or None
    if fault is not None and fault not in TEST_FAULTS:
        raise ValueError(f"{TEST_FAULT_ENV}={fault!r}: expected one of {', '.join(TEST_FAULTS)}")
    return fault


def _operands(n: int):
    """Integer-valued float32 matrices in [-2, 2] and their exact product (float64, CPU)."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    a = torch.randint(-2, 3, (n, n), generator=gen).to(torch.float32)
    b = torch.randint(-2, 3, (n, n), generator=gen).to(torch.float32)
    return a, b, a.double() @ b.double()


def check_matmul(device: str, n: int, time_limit_s: float, repeats: int = 5) -> CheckResult:
    """One warm-up product, then ``repeats`` timed ones; each compared exactly with the reference."""
    import torch

    name = f"matmul:{device}"
    a, b, want = _operands(n)
    corrupt = _test_fault() == "matmul"
    started = time.perf_counter()
    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        da, db = a.to(dev), b.to(dev)
        torch.matmul(da, db)  # warm-up: CUDA context, cuBLAS handle
        _sync(dev)
        timed = time.perf_counter()
        for _ in range(repeats):
            got = torch.matmul(da, db)
        _sync(dev)
        per_product = (time.perf_counter() - timed) / repeats
        got = got.double().cpu()
    except Exception as exc:  # a CUDA error is exactly what this check is for
        return CheckResult(name, False, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    if corrupt:
        got[0, 0] += 1
    seconds = time.perf_counter() - started
    wrong = int((got != want).sum())
    if wrong:
        return CheckResult(name, False, seconds, f"{wrong} of {n * n} elements of a {n}x{n} product are wrong")
    if seconds > time_limit_s:
        return CheckResult(name, False, seconds, f"took {seconds:.2f}s, limit {time_limit_s:g}s")
    tflops = 2 * n ** 3 / per_product / 1e12
    return CheckResult(name, True, seconds, f"{n}x{n} exact; {per_product * 1e3:.2f} ms/product, {tflops:.2f} TFLOP/s")


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _allreduce_rank(rank: int, world: int, backend: str, store_path: str, timeout_s: float, fault: str | None) -> None:
    """One rank of the all-reduce check: contributes rank + 1; the sum must be world*(world+1)/2."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        value = rank + 1 + (1000 if fault == "allreduce" and rank == 0 else 0)
        t = torch.full((1 << 20,), float(value), device=dev)
        dist.all_reduce(t)
        want = world * (world + 1) / 2
        if not bool((t == want).all()):
            raise RuntimeError(f"rank {rank}: all-reduce sum {t[0].item():g}, expected {want:g}")
    finally:
        dist.destroy_process_group()


def check_allreduce(backend: str, world: int, time_limit_s: float) -> CheckResult:
    """Spawn ``world`` processes that all-reduce over ``backend``; all must agree within the limit."""
    import torch.multiprocessing as mp

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragpool-health-") as tmp:
        ctx = mp.start_processes(_allreduce_rank, args=(world, backend, os.path.join(tmp, "store"), time_limit_s,
                                                        _test_fault()),
                                 nprocs=world, join=False, start_method="spawn")
        try:
            deadline = started + time_limit_s
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.perf_counter()))):
                if time.perf_counter() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.kill()
                    return CheckResult(f"allreduce:{backend}", False, time.perf_counter() - started,
                                       f"{world} ranks did not finish within {time_limit_s:g}s")
        except Exception as exc:  # ProcessRaisedException / ProcessExitedException
            first = str(exc).strip().splitlines()
            return CheckResult(f"allreduce:{backend}", False, time.perf_counter() - started,
                               (first[-1] if first else type(exc).__name__)[:500])
    seconds = time.perf_counter() - started
    return CheckResult(f"allreduce:{backend}", True, seconds, f"{world} ranks, 4 MiB float32, exact sum")


def run_checks(expected_gpus: int | None, matmul_size: int = 1024, time_limit_s: float = 60.0,
               allreduce: str = "auto", ranks: int = 2) -> HealthReport:
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = "cuda" if visible else "cpu"
    report = HealthReport(ok=True, device=device, gpus_expected=expected_gpus, gpus_visible=visible)
    started = time.perf_counter()
    if expected_gpus:
        ok = visible == expected_gpus
        detail = f"{visible} visible, {expected_gpus} requested"
        if visible:
            detail += ": " + ", ".join(torch.cuda.get_device_name(i) for i in range(visible))
    else:
        ok, detail = True, (f"{visible} visible (none requested)" if visible else "no GPU requested: CPU path")
    report.checks.append(CheckResult("gpus_visible", ok, time.perf_counter() - started, detail))

    devices = [f"cuda:{i}" for i in range(visible)] or ["cpu"]
    for dev in devices:
        report.checks.append(check_matmul(dev, matmul_size, time_limit_s))

    if allreduce == "gloo":
        report.checks.append(check_allreduce("gloo", ranks, time_limit_s))
    elif allreduce == "auto" and visible >= 2:
        report.checks.append(check_allreduce("nccl", visible, time_limit_s))
    report.ok = all(c.ok for c in report.checks)
    return report


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.components.health",
                                description="Pre-flight node health check (GPUs visible, matmul, all-reduce).")
    p.add_argument("--expected-gpus", type=int, default=None,
                   help=f"GPUs this pod was given (default ${EXPECTED_GPUS_ENV}; unset/0 with no CUDA = CPU path)")
    p.add_argument("--matmul-size", type=_positive(int), default=1024, help="N of the N x N matmul (default 1024)")
    p.add_argument("--time-limit-seconds", type=_positive(float), default=60.0,
                   help="limit per matmul check and for the all-reduce (default 60)")
    p.add_argument("--allreduce", choices=("auto", "off", "gloo"), default="auto",
                   help="auto: NCCL over the local GPUs when there are 2 or more; gloo: over CPU processes")
    p.add_argument("--ranks", type=_positive(int), default=2, help="processes for --allreduce gloo (default 2)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    expected = args.expected_gpus
    try:
        if expected is None and os.environ.get(EXPECTED_GPUS_ENV):
            expected = int(os.environ[EXPECTED_GPUS_ENV])
        if expected is not None and expected < 0:
            raise ValueError(f"expected GPUs must be >= 0, got {expected}")
        _test_fault()
    except ValueError as exc:
        print(f"health: {exc} (set --expected-gpus / {EXPECTED_GPUS_ENV} to a whole number >= 0)", file=sys.stderr)
        return exit_codes.BAD_INPUT
    report = run_checks(expected, args.matmul_size, args.time_limit_seconds, args.allreduce, args.ranks)
    for c in report.checks:
        print(f"health: {'ok  ' if c.ok else 'FAIL'} {c.name} ({c.seconds:.2f}s) {c.detail}", file=sys.stderr)
    print(report.to_json(), flush=True)
    return exit_codes.OK if report.ok else exit_codes.HEALTH_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
