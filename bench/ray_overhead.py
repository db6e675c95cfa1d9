"""What the Ray executor costs against torchrun, on this machine's CPUs.

    python -m bench.ray_overhead [--out .local/bench-ray] [--steps 12] [--long-steps 48] [--n-entities 60]
                                 [--index-entities 600] [--trials 4]

1. The synthetic dataset under ``--out``; a local Ray (``ray.init``, dashboard on as on a KubeRay
   head), timed: ``ray_start_s``.
2. Retriever fine-tuning, same settings (all-MiniLM-L6-v2, 2 ranks, CPU, no checkpoint until the
   end), ``--steps`` and ``--long-steps`` steps, each with ``torchrun --nproc-per-node=2 -m
   training.retriever`` (process start included; run before Ray starts) and with the Ray executor's
   training stage (a Ray Train worker group of 2; worker start included, Ray start excluded).
   ``ray_vs_torchrun`` = Ray wall time / torchrun wall time at ``--steps`` (goal <= 1.10). The two
   step counts split each wall time into a start-up cost and a cost per step (a line through the two
   points): ``ray_vs_torchrun_per_step`` is what a long run pays, ``*_startup_s`` what every stage
   attempt pays once.
3. The index stage (base encoder, ``--index-entities`` entities: 6 passages each, enough that
   encoding outweighs a task's start) as Ray tasks of 1 CPU each, after one untimed pass that starts
   the Ray workers: 1 task, 2 tasks, 1 task, 2 tasks. ``index_parallel_speedup`` = median time with
   1 / median time with 2 (goal >= 1.6 on 2 cores; two processes at once on this host get at most
   ``ddp_host_ceiling`` x 2 of one alone, see bench/train_throughput.py).
4. A Tune search of ``--trials`` trials (2 steps each, 1 worker per trial): ``tune_trials_per_hour``.

One JSON line last with those figures, the wall times behind them and ``goals`` (each goal, held or
not). Exit 0 when every goal holds, 1 otherwise. Measure on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract import exit_codes
from contract.ports import free_port


def _config(shared: Path, run_id: str, steps: int, **extra: object) -> dict:
    from contract.mappings import deep_merge

    base = {"run_id": run_id, "shared_root": str(shared), "device": "cpu",
            "metrics": {"port": 0, "log_every": 1000},
            "retriever": {"max_steps": steps, "global_batch_size": 16, "optim": {"warmup_steps": 1}},
            "checkpoint": {"every_steps": 0, "keep_latest_k": 1},
            "ray": {"placement_timeout_s": 300, "retriever": {"workers": 2, "cpus": 1}}}
    return deep_merge(base, extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".local/bench-ray", help="shared root for data and runs")
    parser.add_argument("--steps", type=int, default=12, help="retriever steps per measurement (default 12)")
    parser.add_argument("--long-steps", type=int, default=48,
                        help="retriever steps of the second measurement (default 48; > --steps)")
    parser.add_argument("--n-entities", type=int, default=60, help="synthetic entities (6 passages each)")
    parser.add_argument("--index-entities", type=int, default=600,
                        help="synthetic entities of the index measurement (default 600)")
    parser.add_argument("--trials", type=int, default=4, help="Tune trials (default 4)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.trials < 1 or args.long_steps <= args.steps or args.index_entities < 1:
        print("bench.ray_overhead: --steps, --trials and --index-entities must be >= 1 and --long-steps > --steps",
              file=sys.stderr)
        return exit_codes.BAD_INPUT

    import yaml

    from training.demo import synthetic
    from contract.paths import child_env
    from contract.ray_auth import AUTH_MODE_ENV
    from training.scheduler.worker.child import stage_entry, torchrun_argv

    out = Path(args.out).resolve()
    shutil.rmtree(out / "runs", ignore_errors=True)
    synthetic.write(out / "datasets" / "synthetic", seed=0, n_entities=args.n_entities)
    index_root = out / "index-corpus"
    synthetic.write(index_root / "datasets" / "synthetic", seed=0, n_entities=args.index_entities)
    os.environ.setdefault(AUTH_MODE_ENV, "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.update(child_env())  # Ray's workers import this checkout's training package

    # torchrun first, before Ray holds any memory or CPU.
    steps = (args.steps, args.long_steps)
    torchrun_s = {}
    for n in steps:
        torch_yaml = out / f"torchrun-{n}.yaml"
        torch_yaml.write_text(yaml.safe_dump(_config(out, f"bench-torchrun-{n}", n)))
        t0 = time.monotonic()
        subprocess.run(torchrun_argv(stage_entry("retriever", torch_yaml), nproc=2), check=True, env=dict(os.environ),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        torchrun_s[n] = time.monotonic() - t0

    import ray

    from training.config.run import load_run_config
    from training.ray import driver, tune
    from training.ray.placement import plan

    temp = tempfile.mkdtemp(prefix="rgb", dir="/tmp")
    t0 = time.monotonic()
    # Dashboard on (as on a KubeRay head): its State API lets Ray Train release the trials Tune stops.
    ray.init(address="local", num_cpus=2, include_dashboard=True, dashboard_port=free_port(), _temp_dir=temp, log_to_driver=False)
    ray_start_s = time.monotonic() - t0
    try:
        ray_s = {}
        for n in steps:
            cfg = load_run_config(_config(out, f"bench-ray-{n}", n))
            t0 = time.monotonic()
            driver.run_training(cfg, "retriever", plan("retriever", cfg.ray.retriever, ray.nodes()))
            ray_s[n] = time.monotonic() - t0

        def index_once(tasks: int, tag: str) -> float:
            cfg = load_run_config(_config(index_root, f"bench-index-{tag}", args.steps, stages=["index"],
                                          index={"use_finetuned": False},
                                          ray={"index": {"workers": tasks, "cpus": 1}}))
            t0 = time.monotonic()
            driver.run_index(cfg, plan("index", cfg.ray.index, ray.nodes()))
            return time.monotonic() - t0

        index_once(2, "warm-up")  # starts (and imports torch in) the workers both measurements reuse
        index_s: dict[int, list[float]] = {1: [], 2: []}
        for rep in range(2):
            for tasks in (1, 2):
                index_s[tasks].append(index_once(tasks, f"{tasks}-{rep}"))

        cfg = load_run_config(_config(out, "bench-tune", 2, stages=["retriever"], ray={
            "retriever": {"workers": 1, "cpus": 0.9},
            "tune": {"num_samples": args.trials, "rungs": 1, "global_batch_size": [8, 16], "eval_questions": 20}}))
        t0 = time.monotonic()
        rows = tune.search(cfg)
        tune_s = time.monotonic() - t0
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)

    short, long_ = steps
    per_step = {name: (t[long_] - t[short]) / (long_ - short) for name, t in (("torchrun", torchrun_s), ("ray", ray_s))}
    index_1, index_2 = statistics.median(index_s[1]), statistics.median(index_s[2])
    figures = {
        "ray_vs_torchrun": round(ray_s[short] / torchrun_s[short], 3),
        "ray_start_s": round(ray_start_s, 2),
        "index_parallel_speedup": round(index_1 / index_2, 3),
        "tune_trials_per_hour": round(len(rows) / (tune_s / 3600), 1),
        "ray_vs_torchrun_long": round(ray_s[long_] / torchrun_s[long_], 3),
        "ray_vs_torchrun_per_step": round(per_step["ray"] / per_step["torchrun"], 3),
        "torchrun_startup_s": round(torchrun_s[short] - short * per_step["torchrun"], 2),
        "ray_startup_s": round(ray_s[short] - short * per_step["ray"], 2),
        "torchrun_retriever_s": {n: round(t, 2) for n, t in torchrun_s.items()},
        "ray_retriever_s": {n: round(t, 2) for n, t in ray_s.items()},
        "index_1_task_s": [round(t, 2) for t in index_s[1]], "index_2_tasks_s": [round(t, 2) for t in index_s[2]],
        "index_passages": 6 * args.index_entities,
        "tune_s": round(tune_s, 2), "tune_trials": len(rows), "steps": list(steps), "cpus": os.cpu_count(),
    }
    figures["goals"] = {"ray_vs_torchrun<=1.10": figures["ray_vs_torchrun"] <= 1.10,
                        "index_parallel_speedup>=1.6": figures["index_parallel_speedup"] >= 1.6}
    print(json.dumps(figures))
    return 0 if all(figures["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
