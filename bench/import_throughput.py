"""Dataset import throughput against a plain boto3 download of the same objects; the last line printed is one
JSON object.

    python bench/import_throughput.py [--objects 64] [--min-mib 1] [--max-mib 4] [--workers 8] [--rounds 3]

One local S3 API (moto's server on 127.0.0.1 in a process of its own, training/localdev/s3_server.py) holds ``--objects`` objects of
``--min-mib`` to ``--max-mib`` MiB (seeded sizes and random bytes). Each round downloads them twice, in
alternating order, into fresh directories:

- plain: a thread pool of ``--workers`` threads, each ``get_object(...)["Body"].read()`` written to a file, nothing
  else (the least any download does);
- import: ``training.datasets.s3sync.run_import`` with the same number of workers: listing, ``IfMatch`` GETs,
  sha256 while streaming, temporary files renamed, the journal, then the manifest and its verification (every
  file re-read and hashed).

Keys: ``import_mib_per_s`` / ``plain_mib_per_s`` (median of the rounds), ``import_vs_plain_download`` (their
ratio; goal >= 0.85), ``objects``, ``mib``, ``workers``, ``rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.datasets import DATA_BUCKETS_ENV  # noqa: E402
from training.datasets.s3sync import run_import  # noqa: E402
from training.localdev.s3_server import s3_environment, s3_server_process  # noqa: E402

BUCKET = "bench-corpus"
PREFIX = "corpus/"
MIB = 1 << 20


def plain_download(client, keys: list[str], dest: Path, workers: int) -> None:
    def one(key: str) -> None:
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        (dest / key.rsplit("/", 1)[-1]).write_bytes(body)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--min-mib", type=float, default=1.0)
    parser.add_argument("--max-mib", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rng = random.Random(38)
    sizes = [int(rng.uniform(args.min_mib, args.max_mib) * MIB) for _ in range(args.objects)]
    total = sum(sizes)
    work = Path(tempfile.mkdtemp(prefix="ragpool-import-bench-"))
    with s3_server_process() as server, s3_environment(server):
        client = server.client(max_pool_connections=args.workers + 2)
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        keys = [f"{PREFIX}shard-{i:04d}.bin" for i in range(args.objects)]
        for key, size in zip(keys, sizes):
            client.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(size))
        plain, imported = [], []
        try:
            for r in range(args.rounds):
                for kind in (("plain", "import") if r % 2 == 0 else ("import", "plain")):
                    dest = work / f"{kind}-{r}"
                    dest.mkdir()
                    started = time.perf_counter()
                    if kind == "plain":
                        plain_download(client, keys, dest, args.workers)
                        plain.append(total / MIB / (time.perf_counter() - started))
                    else:
                        result = run_import(f"s3://{BUCKET}/{PREFIX}", f"datasets/{kind}-{r}", shared_root=str(dest),
                                            workers=args.workers, env={DATA_BUCKETS_ENV: BUCKET},
                                            log=lambda line: None)
                        assert result.ready and len(result.fetched) == args.objects
                        imported.append(total / MIB / (time.perf_counter() - started))
                    shutil.rmtree(dest)
                    print(f"round {r} {kind}: {(plain if kind == 'plain' else imported)[-1]:.1f} MiB/s", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    figures = {"import_mib_per_s": round(statistics.median(imported), 1),
               "plain_mib_per_s": round(statistics.median(plain), 1),
               "import_vs_plain_download": round(statistics.median(imported) / statistics.median(plain), 3),
               "objects": args.objects, "mib": round(total / MIB, 1), "workers": args.workers, "rounds": args.rounds}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
