"""Prometheus metrics of a training process (every rank), names per the ragpool contract.

Each rank serves its own endpoint on ``metrics.port + local_rank`` (``port: 0`` disables
the endpoint; the metrics are still recorded in-process). Labels: run_id, stage, rank.
"""

from __future__ import annotations

import math
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LABELS = ("run_id", "stage", "rank")
_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_CKPT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

#: Every metric name this module exports (the test and dashboards check against it).
METRIC_NAMES = (
    "ragpool_train_step_total",
    "ragpool_train_last_step_timestamp_seconds",
    "ragpool_train_loss",
    "ragpool_train_tokens_per_second",
    "ragpool_train_samples_per_second",
    "ragpool_train_step_duration_seconds",
    "ragpool_checkpoint_last_success_timestamp_seconds",
    "ragpool_checkpoint_duration_seconds",
    "ragpool_gpu_memory_allocated_bytes",
    "ragpool_train_world_size",
    "ragpool_train_min_world_size",
)


class TrainMetrics:
    """The training metric families in their own registry (one per process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # prometheus-client appends _total to counters itself.
        self.step_total = Counter("ragpool_train_step", "Optimizer steps completed", _LABELS, registry=r)
        self.last_step_ts = Gauge("ragpool_train_last_step_timestamp_seconds",
                                  "Unix time of the last completed optimizer step", _LABELS, registry=r)
        self.loss = Gauge("ragpool_train_loss", "Last training loss (NaN/Inf when diverged)", _LABELS, registry=r)
        self.tokens_per_s = Gauge("ragpool_train_tokens_per_second", "Tokens processed per second (this rank)",
                                  _LABELS, registry=r)
        self.samples_per_s = Gauge("ragpool_train_samples_per_second", "Samples processed per second (this rank)",
                                   _LABELS, registry=r)
        self.step_duration = Histogram("ragpool_train_step_duration_seconds", "Wall time of one optimizer step",
                                       _LABELS, buckets=_STEP_BUCKETS, registry=r)
        self.ckpt_last_success = Gauge("ragpool_checkpoint_last_success_timestamp_seconds",
                                       "Unix time the last checkpoint became complete", _LABELS, registry=r)
        self.ckpt_duration = Histogram("ragpool_checkpoint_duration_seconds",
                                       "Wall time to write one checkpoint (snapshot to rename)", _LABELS,
                                       buckets=_CKPT_BUCKETS, registry=r)
        self.gpu_mem = Gauge("ragpool_gpu_memory_allocated_bytes", "CUDA memory allocated by this rank",
                             _LABELS, registry=r)
        self.world_size = Gauge("ragpool_train_world_size", "Ranks the stage trains on (an elastic run's changes "
                                "when it resizes)", _LABELS, registry=r)
        self.min_world_size = Gauge("ragpool_train_min_world_size", "Fewest ranks the stage may train on (an "
                                    "elastic run's nodes.min x ranks per node; a fixed-size run's world size)",
                                    _LABELS, registry=r)
        self.port: int | None = None

    def serve(self, port: int, addr: str = "0.0.0.0", local_rank: int = 0) -> int | None:
        """Start the HTTP endpoint on ``port + local_rank``; ``port == 0`` disables it."""
        if port == 0 or self.port is not None:
            return self.port
        start_http_server(port + local_rank, addr=addr, registry=self.registry)
        self.port = port + local_rank
        return self.port

    def for_stage(self, run_id: str, stage: str, rank: int) -> "StageMetrics":
        return StageMetrics(self, {"run_id": run_id, "stage": stage, "rank": str(rank)})


class StageMetrics:
    """The families bound to one (run_id, stage, rank)."""

    def __init__(self, m: TrainMetrics, labels: dict[str, str]) -> None:
        self.m, self.labels = m, labels
        # Touch every series so the endpoint lists them from the start.
        for fam in (m.step_total, m.last_step_ts, m.loss, m.tokens_per_s, m.samples_per_s, m.step_duration,
                    m.ckpt_last_success, m.ckpt_duration, m.world_size, m.min_world_size):
            fam.labels(**labels)

    def step(self, loss: float, duration_s: float, samples: int, tokens: int) -> None:
        m, lb = self.m, self.labels
        m.step_total.labels(**lb).inc()
        m.last_step_ts.labels(**lb).set(time.time())
        m.loss.labels(**lb).set(loss if not math.isnan(loss) else float("nan"))
        m.step_duration.labels(**lb).observe(duration_s)
        if duration_s > 0:
            m.samples_per_s.labels(**lb).set(samples / duration_s)
            m.tokens_per_s.labels(**lb).set(tokens / duration_s)
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                m.gpu_mem.labels(**lb).set(torch.cuda.memory_allocated())
        except ImportError:  # pragma: no cover - torch is always there in the image
            pass

    def world(self, size: int, min_size: int | None = None) -> None:
        """The ranks this stage trains on from now (set at every start, so an elastic run's resizes show), and the
        fewest it may (``min_size``; None: ``size``, a fixed-size run)."""
        self.m.world_size.labels(**self.labels).set(size)
        self.m.min_world_size.labels(**self.labels).set(size if min_size is None else min_size)

    def checkpoint(self, duration_s: float) -> None:
        self.m.ckpt_duration.labels(**self.labels).observe(duration_s)
        self.m.ckpt_last_success.labels(**self.labels).set(time.time())

    def close(self) -> None:
        """Drop this stage's series once it finished: a pipeline process lives on into
        later stages, and a finished stage must not look stalled to the alert rules."""
        values = tuple(self.labels[k] for k in _LABELS)
        for fam in (self.m.step_total, self.m.last_step_ts, self.m.loss, self.m.tokens_per_s,
                    self.m.samples_per_s, self.m.step_duration, self.m.ckpt_last_success,
                    self.m.ckpt_duration, self.m.gpu_mem, self.m.world_size, self.m.min_world_size):
            try:
                fam.remove(*values)
            except KeyError:  # never observed (e.g. GPU memory on CPU)
                pass


_PROCESS_METRICS: TrainMetrics | None = None


def process_metrics() -> TrainMetrics:
    """The single :class:`TrainMetrics` of this process (stages of a pipeline share it)."""
    global _PROCESS_METRICS
    if _PROCESS_METRICS is None:
        _PROCESS_METRICS = TrainMetrics()
    return _PROCESS_METRICS
