"""The index stage as the corpus grows: memory stays flat, throughput holds, IVF-PQ is small and finds what
flat finds. The last line printed is one JSON object.

    python bench/corpus_scale.py                      # 100 k and 1.6 M passages (16x), tiny encoder, 2 ranks
    python bench/corpus_scale.py --sizes 20000,80000 --recall-passages 20000   # a quick look

Scale (the tiny 32-dim encoder, ``index.kind: ivfpq``, 2 torchrun ranks on a corpus prepared in place with
``ragpool data prepare``): each size is one whole index stage (``python -m training.index`` under torchrun)
started from a fresh interpreter that reports ``RUSAGE_CHILDREN``'s ``ru_maxrss``: the peak RSS of the
biggest process of the stage (the torchrun agent, each rank, the merge on rank 0).

  peak_rss_growth       biggest process's peak RSS at the largest size / at the smallest. Goal <= 1.25
  throughput_ratio      passages/s of the whole stage at the largest size / at the smallest. Goal >= 0.85
  pq_bytes_ratio        IVF-PQ index bytes per passage / flat's (4 x dim), with the real MiniLM (384 dims,
                        pq_m 96: 4 dimensions a one-byte code) on the recall corpus. Goal <= 0.125
  pq_recall_ratio       recall@10 of IVF-PQ / flat's on the same questions, real MiniLM embeddings of a
                        synthetic corpus of >= 100 k passages (computed once, cached in --dir). Goal >= 0.90
  lookup_us_jsonl / lookup_us_parquet   one passage fetched by row at random: a seek into a JSONL shard with
                        the offsets table / the row's group read from a Parquet file of the same rows
                        (64 k-row groups): why shards are JSONL
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORDS = [f"w{i}" for i in range(5000)]


def write_corpus(path: Path, n: int, seed: int) -> None:
    """``n`` passages of 6-12 random words in 4 JSONL shards."""
    path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    per = -(-n // 4)
    for s in range(4):
        with (path / f"shard-{s:02d}.jsonl").open("w") as fh:
            for i in range(s * per, min(n, (s + 1) * per)):
                fh.write(json.dumps({"id": f"p{i}", "text": " ".join(rng.choices(WORDS, k=rng.randint(6, 12)))})
                         + "\n")


def stage_rss(shared: Path, run_id: str, encoder: Path, rel: str) -> dict:
    """One whole index stage (2 ranks) from a fresh interpreter: wall seconds and the biggest child's peak RSS."""
    from tests.support.training import stage_cmd, stage_env, write_run

    qa = rel.rsplit("/", 1)[0] + "/qa.jsonl"
    spec = write_run(shared, run_id, data={"corpus": rel, "qa_train": qa, "qa_eval": qa},
                     retriever={"model": str(encoder), "max_length": 16},
                     index={"kind": "ivfpq", "nlist": 256, "nprobe": 16, "pq_m": 8, "pq_bits": 8,
                            "use_finetuned": False, "batch_size": 256, "part_rows": 65536})
    probe = ("import resource, subprocess, sys, json, time; t = time.monotonic(); "
             "rc = subprocess.run(sys.argv[1:]).returncode; "
             "print(json.dumps({'rc': rc, 'seconds': time.monotonic() - t, "
             "'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
    out = subprocess.run([sys.executable, "-c", probe, *stage_cmd("index", spec, [], nproc=2)], cwd=REPO,
                         env=stage_env(), capture_output=True, text=True, timeout=3600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["rc"] != 0:
        raise SystemExit(f"index stage failed at {run_id}: {out.stderr[-3000:]}")
    marker = json.loads((shared / "runs" / run_id / "index" / "_COMPLETE").read_text())
    return {**result, "passages": marker["passages"], "index_bytes": marker["index_bytes"]}


def lookup_times(corpus_dir: Path, n: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.components.corpus import Corpus, PREPARED_DIR

    corpus = Corpus(corpus_dir / PREPARED_DIR)
    rows = random.Random(0).sample(range(corpus.rows), 2000)
    t = time.perf_counter()
    for r in rows:
        corpus.passage(r)
    jsonl_us = (time.perf_counter() - t) / len(rows) * 1e6
    table_path = corpus_dir.parent / "corpus.parquet"
    if not table_path.exists():
        recs = [json.loads(line) for f in sorted(corpus_dir.glob("*.jsonl")) for line in f.open()]
        pq.write_table(pa.table({"id": [r["id"] for r in recs], "text": [r["text"] for r in recs]}), table_path,
                       row_group_size=65536)
    pf = pq.ParquetFile(table_path)
    t = time.perf_counter()
    for r in rows[:200]:
        pf.read_row_group(r // 65536).slice(r % 65536, 1).to_pylist()
    parquet_us = (time.perf_counter() - t) / 200 * 1e6
    return {"lookup_us_jsonl": round(jsonl_us, 1), "lookup_us_parquet": round(parquet_us, 1)}


def recall(work: Path, n_passages: int) -> dict:
    """recall@10 of IVF-PQ over flat with real MiniLM embeddings of a synthetic corpus (cached)."""
    import numpy as np

    from training.components import faiss_index as FI
    from training.components.search import build_faiss
    from training.demo import synthetic

    cache = work / f"minilm-{n_passages}.npz"
    if not cache.exists():
        import torch

        from training.components.models import encode_texts, load_encoder

        torch.set_num_threads(2)
        data = synthetic.generate(7, max(5, n_passages // 6))
        model, tok = load_encoder("")
        passages = [p["text"] for p in data["corpus"]]
        questions = [q["question"] for q in data["qa_eval"]][:2000]
        pos = {p["id"]: i for i, p in enumerate(data["corpus"])}
        gold = np.array([pos[q["positive_ids"][0]] for q in data["qa_eval"]][:2000])
        p = encode_texts(model, tok, passages, 64, 256, torch.device("cpu")).numpy()
        q = encode_texts(model, tok, questions, 64, 256, torch.device("cpu")).numpy()
        np.savez(cache, p=p, q=q, gold=gold)
    z = np.load(cache)
    p, q, gold = z["p"], z["q"], z["gold"]
    n, dim = p.shape

    import faiss

    class IC:  # nlist ~ n / 100 (1024 at 100 k passages), nprobe 1/8 of the lists
        kind, pq_m, pq_bits, opq, hnsw_m, hnsw_ef_search = "ivfpq", 96, 8, False, 32, 64
        nlist = max(16, min(1024, n // 100))
        nprobe = max(1, nlist // 8)

    flat = build_faiss(p, "flat", 1, 1, 1, 1)
    index = FI._new("ivfpq", dim, IC)
    rng = np.random.default_rng(0)
    index.train(p[rng.choice(n, FI.train_size(n, IC.nlist, IC.pq_bits), replace=False)])
    index.add(p)
    faiss.extract_index_ivf(index).nprobe = IC.nprobe
    k = 10
    _, f = flat.search(q, k)
    _, g = index.search(q, k)
    r_flat = float(np.mean([gold[i] in f[i] for i in range(len(gold))]))
    r_pq = float(np.mean([gold[i] in g[i] for i in range(len(gold))]))
    path = work / "pq.faiss"
    faiss.write_index(index, str(path))
    pq_bytes = path.stat().st_size / n
    return {"recall_passages": n, "recall_dim": dim, "recall10_flat": r_flat, "recall10_ivfpq": r_pq,
            "pq_recall_ratio": r_pq / r_flat if r_flat else 0.0, "pq_bytes_per_passage": round(pq_bytes, 2),
            "pq_bytes_ratio": pq_bytes / (4 * dim)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1600000")
    ap.add_argument("--recall-passages", type=int, default=100_000)
    ap.add_argument("--dir", default="/tmp/ragpool-corpus-bench")
    args = ap.parse_args()
    from training.components.corpus import PREPARED_DIR, prepare
    from training.demo.tiny_models import build_tiny_encoder

    work = Path(args.dir)
    shared = work / "shared"
    encoder = work / "tiny-encoder"
    if not encoder.exists():
        build_tiny_encoder(encoder)
    rows: dict[int, dict] = {}
    for n in [int(s) for s in args.sizes.split(",")]:
        rel = f"datasets/c{n}/passages"
        src = shared / rel
        if not (src / PREPARED_DIR / "manifest.json").exists():
            write_corpus(src, n, seed=n)
            (src.parent / "qa.jsonl").write_text(json.dumps({"question": "q", "answer": "a",
                                                             "positive_ids": ["p0"]}) + "\n")
            t = time.monotonic()
            r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            prepare(src, src / PREPARED_DIR)
            print(f"prepared {n} passages in {time.monotonic() - t:.1f}s (bench RSS {r0} -> "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} kB)", flush=True)
        import shutil

        shutil.rmtree(shared / "runs" / f"scale-{n}", ignore_errors=True)
        rows[n] = stage_rss(shared, f"scale-{n}", encoder, rel)
        rows[n]["passages_per_s"] = n / rows[n]["seconds"]
        print(f"{n}: {rows[n]}", flush=True)
    small, big = min(rows), max(rows)
    out = {"sizes": sorted(rows), "peak_rss_kb": {n: rows[n]["maxrss_kb"] for n in sorted(rows)},
           "seconds": {n: round(rows[n]["seconds"], 1) for n in sorted(rows)},
           "peak_rss_growth": rows[big]["maxrss_kb"] / rows[small]["maxrss_kb"],
           "throughput_ratio": rows[big]["passages_per_s"] / rows[small]["passages_per_s"],
           "tiny_ivfpq_bytes_per_passage": rows[big]["index_bytes"] / big,
           **lookup_times(shared / f"datasets/c{small}/passages", small)}
    out.update(recall(work, args.recall_passages))
    out["goals_met"] = out["peak_rss_growth"] <= 1.25 and out["throughput_ratio"] >= 0.85 and \
        out["pq_bytes_ratio"] <= 0.125 and out["pq_recall_ratio"] >= 0.90
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
