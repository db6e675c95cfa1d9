"""A large corpus through the whole pipeline and the queue, under both executors, on this machine. The last
line printed is one JSON object.

    python bench/corpus_pipeline.py                   # 1 M passages, tiny encoder, torchrun then ray
    python bench/corpus_pipeline.py --passages 50000 --executors torchrun     # a quick look

The corpus is the synthetic set's passages (whose questions train and evaluate the run) plus filler
passages up to ``--passages``, as JSONL shards in one directory, prepared with ``ragpool data prepare``. A
local redis-server; ``ragpool submit`` of a four-stage run (tiny encoder, ``index.kind: ivfpq``) and one
queue worker running it with torchrun on 2 processes; then the same run as ``executor: ray`` on a local Ray
head (2 CPUs) with one Ray worker. Reported per executor: the run's final state, wall seconds, the biggest
process's peak RSS (``RUSAGE_CHILDREN`` of the worker's interpreter: every rank, task and driver it
waited for; for Ray the Ray processes are the head's children, so the head's own tree is sampled), and
the evaluation's recall@10.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.env import NAMESPACE_ENV, REDIS_URL_ENV  # noqa: E402
from contract.names import DEFAULT_NAMESPACE  # noqa: E402

FILLER_PER_SHARD = 250_000


def build_corpus(shared: Path, passages: int) -> str:
    """``datasets/big/``: the synthetic set's questions, its passages as shard 0 and filler shards after."""
    from training.components.corpus import PREPARED_DIR, prepare
    from training.demo import synthetic

    base = shared / "datasets" / "big"
    corpus = base / "passages"
    if (corpus / PREPARED_DIR / "manifest.json").is_file():
        return "datasets/big/passages"
    shutil.rmtree(base, ignore_errors=True)
    synthetic.write(base / "synthetic", seed=11, n_entities=40)
    corpus.mkdir(parents=True)
    shutil.copy(base / "synthetic" / "corpus.jsonl", corpus / "shard-000.jsonl")
    have = sum(1 for _ in (corpus / "shard-000.jsonl").open())
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    n, shard = have, 1
    while n < passages:
        with (corpus / f"shard-{shard:03d}.jsonl").open("w") as fh:
            for i in range(n, min(passages, n + FILLER_PER_SHARD)):
                fh.write(json.dumps({"id": f"filler-{i}", "text": " ".join(rng.choices(words, k=rng.randint(6, 12)))})
                         + "\n")
        n, shard = min(passages, n + FILLER_PER_SHARD), shard + 1
    prepare(corpus, corpus / PREPARED_DIR)
    return "datasets/big/passages"


def spec_for(shared: Path, run_id: str, corpus: str, encoder: Path, executor: str) -> dict:
    from training.demo.direct import demo_spec

    overrides = {
        "data": {"corpus": corpus, "qa_train": "datasets/big/synthetic/qa_train.jsonl",
                 "qa_eval": "datasets/big/synthetic/qa_eval.jsonl"},
        "retriever": {"model": str(encoder), "max_length": 16, "max_steps": 4, "global_batch_size": 16},
        "index": {"kind": "ivfpq", "nlist": 256, "nprobe": 32, "pq_m": 8, "pq_bits": 8, "batch_size": 256,
                  "part_rows": 65536},
        "generator": {"max_steps": 4, "global_batch_size": 8},
        "evaluate": {"compare_pretrained": False, "recall_at": [1, 10]},
    }
    if executor == "ray":
        stage = {"pool": "gpu-spot"}
        overrides["ray"] = {"placement_timeout_s": 300, "max_failures": 1, "prepare": {**stage, "workers": 2},
                            "retriever": {**stage, "workers": 2}, "index": {**stage, "workers": 2},
                            "generator": {**stage, "workers": 2}, "evaluate": stage}
    spec = demo_spec(run_id, 2 if executor == "torchrun" else None, shared, overrides=overrides)
    spec.update(max_attempts=1, timeout_seconds=7200)
    if executor == "ray":
        spec["executor"] = "ray"
    return spec


def _peak_tree_rss_kb(root: int) -> int:
    """The largest RSS among ``root``'s descendants now (Linux /proc): a Ray head's raylet, workers and driver."""
    parent, rss = {}, {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                rss[int(proc.name)] = int((proc / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
            except (OSError, IndexError, ValueError):
                continue

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    return max((kb for pid, kb in rss.items() if under(pid)), default=0)


def run_one(executor: str, shared: Path, corpus: str, encoder: Path, env: dict[str, str], head=None) -> dict:
    import yaml

    from contract.env import EXECUTORS_ENV
    from training.scheduler import cli as runs_cli
    from training.scheduler.redis_conn import connect
    from training.scheduler.run_queue import TaskQueue

    run_id = f"big-{executor}"
    shutil.rmtree(shared / "runs" / run_id, ignore_errors=True)
    path = shared / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(spec_for(shared, run_id, corpus, encoder, executor), sort_keys=False))
    assert runs_cli.main(["submit", str(path)]) == 0
    worker_env = {**env, EXECUTORS_ENV: executor}
    if head is not None:
        worker_env.update(head.client_env(), RAY_ADDRESS=head.address)
    probe = ("import resource, subprocess, sys, json; rc = subprocess.run(sys.argv[1:]).returncode; "
             "print(json.dumps({'rc': rc, 'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
    t0 = time.monotonic()
    worker = subprocess.Popen([sys.executable, "-c", probe, sys.executable, "-m", "training.worker",
                               "--idle-exit-seconds", "0", "--lease-seconds", "60", "--poll-seconds", "0.5"],
                              env=worker_env, stdout=subprocess.PIPE, text=True)
    ray_peak = 0
    while worker.poll() is None:
        if head is not None and head.process is not None:
            ray_peak = max(ray_peak, _peak_tree_rss_kb(head.process.pid))
        time.sleep(2)
    seconds = time.monotonic() - t0
    result = json.loads(worker.stdout.read().strip().splitlines()[-1])
    info = TaskQueue(connect(), namespace=env[NAMESPACE_ENV]).get(run_id)
    report = shared / "runs" / run_id / "evaluate" / "report.json"
    recall = json.loads(report.read_text())["retrieval"].get("recall@10") if report.is_file() else None
    marker = shared / "runs" / run_id / "index" / "_COMPLETE"
    return {"state": info.state if info else None, "seconds": round(seconds, 1),
            "peak_rss_kb": max(result["maxrss_kb"], ray_peak), "recall@10": recall,
            "passages": json.loads(marker.read_text())["passages"] if marker.is_file() else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--executors", default="torchrun,ray")
    ap.add_argument("--dir", default="/tmp/ragpool-corpus-pipeline")
    args = ap.parse_args()
    from contract.paths import SHARED_ROOT_ENV, child_env
    from contract.ray_pools import POOLS_ENV
    from training.demo.tiny_models import build_tiny_encoder
    from training.localdev.redis_server import LocalRedisServer

    work = Path(args.dir)
    shared = work / "shared"
    encoder = shared / "models" / "tiny-encoder"
    if not encoder.exists():
        build_tiny_encoder(encoder)
    t = time.monotonic()
    corpus = build_corpus(shared, args.passages)
    prepared_s = time.monotonic() - t
    server = LocalRedisServer(appendonly=True).start()
    queue = {REDIS_URL_ENV: server.url, SHARED_ROOT_ENV: str(shared), NAMESPACE_ENV: DEFAULT_NAMESPACE}
    env = {**child_env(), **queue, "HF_HUB_OFFLINE": "1"}
    os.environ.update(queue)
    out: dict = {"passages": args.passages, "build_and_prepare_s": round(prepared_s, 1)}
    try:
        for executor in [e for e in args.executors.split(",") if e]:
            head = None
            if executor == "ray":
                from training.demo.ray_queue import launch_head

                os.environ[POOLS_ENV] = env[POOLS_ENV] = "gpu-spot=0"
                head = launch_head()
                head.wait_ready()
            try:
                out[executor] = run_one(executor, shared, corpus, encoder, env, head)
            finally:
                if head is not None:
                    head.stop()
            print(f"{executor}: {out[executor]}", flush=True)
    finally:
        server.stop()
    out["all_succeeded"] = all(out[e]["state"] == "succeeded" for e in args.executors.split(",") if e)
    print(json.dumps(out))
    return 0 if out["all_succeeded"] else 1


if __name__ == "__main__":
    sys.exit(main())
