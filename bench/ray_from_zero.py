"""How long a Ray run waits on an idle cluster before its first stage runs (``ray_from_zero_s``).

    python -m bench.ray_from_zero [--out DIR]

On a local autoscaling Ray cluster (:mod:`training.demo.ray_autoscaling`: Ray's autoscaler v2 with its
fake multi-node provider, a 0-CPU head like the RayCluster's, one worker node type for pool
``gpu-bench`` with ``min_workers: 0``), idle, a run is submitted through the Ray driver
(:func:`training.ray.driver.submit`, ``RAGPOOL_RAY_POOLS`` declaring the pool). ``ray_from_zero_s`` is
the time from the submit to its first stage (``prepare``) holding its placement group on a node the
autoscaler added for it, i.e. running. The cluster's start-up is not counted (on Kubernetes the head is
long-lived); a real cluster adds the time Karpenter and the kubelet take to bring a GPU node and pull
the image. The run (the index stage with a tiny encoder) is then waited for, and the cluster for
scaling back to zero, so that a broken run or scale-down fails the bench rather than passing silently.

Prints one JSON line last: ``{"ray_from_zero_s": ...}``. ``bench/autoscale.py`` calls :func:`measure`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

POOL = "gpu-bench"
RUN_ID = "bench-ray-from-zero"
RUN_TIMEOUT_S = 300.0
"""Bound on the whole run after its first stage started (the index stage of a tiny encoder: seconds)."""
SCALE_TIMEOUT_S = 120.0
"""Bound on the first stage starting, and on the cluster scaling back to zero after the run."""


def node_types() -> list[Any]:
    """The cluster the measurement runs on: one pool, one node of 2 CPUs and 1 (logical) GPU at most."""
    from training.demo.ray_autoscaling import PoolNodeType

    return [PoolNodeType(POOL, cpus=2, gpus=1, max_workers=1)]


def run_config(shared: Path, encoder: Path, run_id: str = RUN_ID, pool: str = POOL) -> dict[str, Any]:
    """A small run whose stages all wait for ``pool``: data preparation, then the index of the corpus."""
    stage = {"pool": pool, "workers": 1, "cpus": 1}
    return {"run_id": run_id, "shared_root": str(shared), "device": "cpu", "stages": ["index"],
            "metrics": {"port": 0, "log_every": 1000}, "retriever": {"model": str(encoder)},
            "index": {"use_finetuned": False},
            "ray": {"placement_timeout_s": SCALE_TIMEOUT_S, "prepare": stage, "index": stage}}


def first_stage_s(cluster: Any, tmp_dir: Path, run_id: str = RUN_ID, pool: str = POOL) -> float:
    """On the connected, idle ``cluster``: submit a run on ``pool``, return submit -> first stage running
    (seconds); then wait for the run to complete and the cluster to scale back to zero."""
    import ray

    from training.config.run import load_run_config
    from training.demo import synthetic
    from training.demo.ray_autoscaling import wait_placement_group
    from training.demo.tiny_models import build_tiny_encoder
    from training.ray import driver
    from contract.ray_pools import POOLS_ENV, format_pools

    shared = tmp_dir / "shared"
    synthetic.write(shared / "datasets" / "synthetic", seed=0, n_entities=12)
    encoder = build_tiny_encoder(tmp_dir / "encoder")
    cfg = load_run_config(run_config(shared, encoder, run_id, pool))
    os.environ[POOLS_ENV] = format_pools({t.pool: t.gpus for t in cluster.node_types})
    cluster.wait_idle(SCALE_TIMEOUT_S)
    t0 = time.monotonic()
    ref = driver.submit(cfg)
    wait_placement_group(f"{run_id}-{driver.PREPARE}", SCALE_TIMEOUT_S)
    elapsed = time.monotonic() - t0
    try:
        summaries = ray.get(ref, timeout=RUN_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"waited {RUN_TIMEOUT_S:g}s for run {run_id} to complete after its first stage started; "
                           f"worker nodes by pool: {cluster.pools_up() or 'none'}") from None
    if "passages" not in summaries.get("index", {}):
        raise RuntimeError(f"the run did not index the corpus: {summaries}")
    cluster.wait_idle(SCALE_TIMEOUT_S)
    return round(elapsed, 3)


def measure(tmp_dir: Path) -> float:
    """``ray_from_zero_s``: start a local autoscaling cluster in ``tmp_dir``, measure, stop it (this process's
    environment is as it was afterwards)."""
    from training.demo.ray_autoscaling import LocalAutoscalingCluster, connected
    from contract.paths import child_env
    from contract.ray_auth import AUTH_MODE_ENV

    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    saved = dict(os.environ)
    try:
        os.environ.update(child_env())  # the driver's tasks import this checkout's training package
        os.environ[AUTH_MODE_ENV] = "disabled"  # the cluster runs without token auth (ray_autoscaling)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        with connected(LocalAutoscalingCluster(node_types=node_types())) as cluster:
            return first_stage_s(cluster, tmp_dir)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_from_zero", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="", help="working directory (default: a fresh temp dir)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve() if args.out else Path(tempfile.mkdtemp(prefix="ray-from-zero-"))
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"ray_from_zero_s": measure(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
