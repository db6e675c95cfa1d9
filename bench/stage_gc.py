"""What the stage process's collector policy (training/components/heap.py) buys; the last line printed is one
JSON object.

    python bench/stage_gc.py [--runs 5] [--dir /tmp/ragpool-stage-gc]

Runs the retriever stage (one process, the tiny 2-layer encoder of the tests, 6 steps, checkpoints) ``--runs``
times with the policy and as many times with it turned off (``heap``'s functions replaced by no-ops in the
child before the stage starts), alternating. In each child, ``gc.callbacks`` time every collection.

Keys: ``gc_seconds`` / ``gc_seconds_off`` (median CPU-seconds the collector ran in one stage process, with and
without the policy), ``full_collections`` / ``full_collections_off`` (median generation-2 collections),
``process_cpu_seconds`` / ``process_cpu_seconds_off`` (median user+system CPU of the child) and
``saved_cpu_seconds`` (the difference of those medians). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The child: time every collection, optionally turn the policy off, run the stage as ``python -m`` would.
CHILD = """
import gc, json, runpy, sys, time
out, off = sys.argv[1], sys.argv[2] == "off"
del sys.argv[1:3]
spent, count, started = [0.0], {0: 0, 1: 0, 2: 0}, [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.process_time()
    else:
        spent[0] += time.process_time() - started[0]
        count[info["generation"]] += 1
gc.callbacks.append(timed)
if off:
    from training.components import heap
    for name in heap.__all__:
        setattr(heap, name, lambda: None)
try:
    runpy.run_module("training.retriever", run_name="__main__")
finally:
    with open(out, "w") as fh:
        json.dump({"gc_seconds": spent[0], "collections": count}, fh)
"""


def _setup(root: Path) -> Path:
    import yaml

    from training.demo import synthetic
    from training.demo.tiny_models import build_tiny_encoder

    encoder = build_tiny_encoder(root / "encoder")
    synthetic.write(root / "datasets" / "synthetic", seed=3, n_entities=20)
    spec = {"run_id": "gc", "shared_root": str(root), "device": "cpu", "metrics": {"port": 0, "log_every": 1},
            "retriever": {"model": str(encoder), "global_batch_size": 8, "max_steps": 6, "hard_negatives": 1,
                          "max_length": 32, "optim": {"lr": 1e-3, "warmup_steps": 2}},
            "checkpoint": {"every_steps": 2, "async_save": True, "keep_latest_k": 2}}
    path = root / "gc.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _one(root: Path, config: Path, mode: str) -> dict:
    from contract import paths

    shutil.rmtree(root / "runs", ignore_errors=True)
    out = root / f"gc-{mode}.json"
    env = {**paths.child_env(), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), mode, "--config", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"stage_gc: the retriever stage failed ({mode}, exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    got = json.loads(out.read_text())
    got["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="stage processes per mode (default 5)")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed after)")
    args = ap.parse_args(argv)
    from contract.exit_codes import BAD_INPUT, OK

    if args.runs < 1:
        print(f"stage_gc: --runs={args.runs}: must be at least 1", file=sys.stderr)
        return BAD_INPUT
    root = args.dir or Path(tempfile.mkdtemp(prefix="ragpool-stage-gc-"))
    try:
        config = _setup(root)
        runs: dict[str, list[dict]] = {"on": [], "off": []}
        for _ in range(args.runs):
            for mode in ("on", "off"):
                runs[mode].append(_one(root, config, mode))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    def med(mode: str, key) -> float:
        return round(statistics.median(key(r) for r in runs[mode]), 3)

    result = {"runs": args.runs,
              "gc_seconds": med("on", lambda r: r["gc_seconds"]),
              "gc_seconds_off": med("off", lambda r: r["gc_seconds"]),
              "full_collections": med("on", lambda r: r["collections"]["2"]),
              "full_collections_off": med("off", lambda r: r["collections"]["2"]),
              "process_cpu_seconds": med("on", lambda r: r["cpu"]),
              "process_cpu_seconds_off": med("off", lambda r: r["cpu"])}
    result["saved_cpu_seconds"] = round(result["process_cpu_seconds_off"] - result["process_cpu_seconds"], 3)
    print(json.dumps(result))
    return OK


if __name__ == "__main__":
    sys.exit(main())
