"""Local end-to-end demo on CPU, no cloud: synthetic data -> torchrun pipeline -> report.

    python -m training.demo --out .local/demo [--nproc 2] [--n-entities 100]

Generates the synthetic dataset under ``OUT/datasets/synthetic`` (OUT is the shared
root), writes ``OUT/run.yaml``, runs
``torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 0 --standalone -m training.pipeline --config OUT/run.yaml``
(the command the queue worker runs, from training/scheduler/worker/child.py)
(retriever -> index -> generator -> evaluate), then prints the evaluation report, the
artifact paths, the wall time and the peak resident memory of the whole process tree.
Rerunning skips the stages that are already complete.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from training.demo import synthetic


def demo_config(out: Path, run_id: str) -> dict:
    """The run spec of the demo: sized to finish in a few minutes on 2 CPU cores."""
    return {
        "run_id": run_id,
        "shared_root": str(out),
        "stages": ["retriever", "index", "generator", "evaluate"],
        "device": "cpu",
        "data": {"corpus": "datasets/synthetic/corpus.jsonl", "qa_train": "datasets/synthetic/qa_train.jsonl",
                 "qa_eval": "datasets/synthetic/qa_eval.jsonl"},
        "retriever": {"max_steps": 20, "global_batch_size": 16, "hard_negatives": 2,
                      "optim": {"lr": 5.0e-5, "warmup_steps": 3}},
        "index": {"kind": "flat"},
        "generator": {"max_steps": 200, "global_batch_size": 16, "optim": {"lr": 3.0e-3, "warmup_steps": 10}},
        "evaluate": {"compare_pretrained": True},
        "checkpoint": {"every_steps": 50, "keep_latest_k": 1},
        "metrics": {"port": 0, "log_every": 25},
    }


def demo_spec(run_id: str, nproc: int | None, shared: Path, overrides: dict | None = None) -> dict:
    """The demo run as a run spec, sized like ``python -m training.demo`` (its config is the one source);
    ``overrides`` are merged into that config first (the Ray half's smaller runs)."""
    from contract.mappings import deep_merge
    from training.config.run import flatten
    from training.config.sections import STAGES
    from training.scheduler.spec import RUN_SECTION

    config = deep_merge(demo_config(shared, run_id), overrides or {})
    stages = [s for s in STAGES if s in config["stages"]]
    hyper = {stage: flatten(config[stage]) for stage in stages if config.get(stage)}
    run_wide = {k: v for k, v in config.items()
                if k not in ("run_id", "shared_root", "stages", "data", *STAGES)}
    if run_wide:
        hyper[RUN_SECTION] = flatten(run_wide)
    return {"run_id": run_id, "stages": stages, "data": config["data"], "hyperparameters": hyper,
            **({"gpus_per_node": nproc} if nproc else {}), "priority": "normal", "max_attempts": 2,
            "timeout_seconds": 1800}


def artifact_paths(run_dir: Path) -> dict[str, str]:
    """Where a pipeline run leaves its models, index and report."""
    return {"run_dir": str(run_dir), "retriever_model": str(run_dir / "retriever" / "model"),
            "index": str(run_dir / "index" / "index.faiss"),
            "generator_model": str(run_dir / "generator" / "model"),
            "report": str(run_dir / "evaluate" / "report.json")}


def _tree_rss_bytes(root_pid: int) -> int:
    """Resident memory of ``root_pid`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            ppid, pages = int(fields[1]), int(fields[21])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = pages * os.sysconf("SC_PAGE_SIZE")
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".local/demo", help="shared root for data and runs (default .local/demo)")
    parser.add_argument("--run-id", default="demo", help="run id (default demo)")
    parser.add_argument("--nproc", type=int, default=2, help="processes for torchrun (default 2)")
    parser.add_argument("--n-entities", type=int, default=100, help="synthetic entities (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="dataset seed")
    args = parser.parse_args(argv)

    out = Path(args.out).resolve()
    data_dir = out / "datasets" / "synthetic"
    synthetic.write(data_dir, args.seed, args.n_entities)
    run_yaml = out / "run.yaml"
    run_yaml.write_text(yaml.safe_dump(demo_config(out, args.run_id), sort_keys=False))
    print(f"dataset: {data_dir}\nrun spec: {run_yaml}", flush=True)

    from contract.paths import child_env
    from training.scheduler.worker.child import stage_entry, torchrun_argv

    cmd = torchrun_argv(stage_entry("pipeline", run_yaml), nproc=args.nproc)
    print("running:", " ".join(cmd), flush=True)

    env = child_env()
    env.setdefault("PYTHONWARNINGS", "ignore")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    done.set()
    sampler.join()
    wall = time.monotonic() - t0
    run_dir = out / "runs" / args.run_id
    summary = {"exit_code": rc, "wall_seconds": round(wall, 1), "peak_rss_gb": round(peak[0] / 2**30, 2),
               "artifacts": artifact_paths(run_dir)}
    print(json.dumps(summary, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
