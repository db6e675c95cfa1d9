"""The ragpool metric contract: every ``ragpool_*`` name the rules and dashboards may use.

One place for the names shared by training (``training/components/metrics.py``), the queue worker,
the rules and the dashboards. A test proves every ``ragpool_*`` name a rule or panel uses
is listed here; the lead's cross-check compares this table with the real exporters.

Names are the exposed names: counters include ``_total`` (prometheus-client appends it);
a histogram ``X`` is exposed as ``X_bucket``, ``X_sum`` and ``X_count``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class ContractMetric:
    """One metric of the contract."""

    name: str
    """Exposed family name (counters end in ``_total``)."""
    type: MetricType
    """Prometheus metric type."""
    labels: tuple[str, ...]
    """Label names the exporter sets (scrape-time target labels come on top)."""
    exporter: Literal["training", "queue"]
    """Which ragpool process exports it: every training rank, or the queue worker."""
    help: str
    """What one sample means."""


_TRAIN = ("run_id", "stage", "rank")

CONTRACT: tuple[ContractMetric, ...] = (
    ContractMetric("ragpool_train_step_total", "counter", _TRAIN, "training", "optimizer steps completed"),
    ContractMetric("ragpool_train_last_step_timestamp_seconds", "gauge", _TRAIN, "training",
                   "unix time of the last completed step (0 before the first step)"),
    ContractMetric("ragpool_train_loss", "gauge", _TRAIN, "training", "last loss (may be NaN/Inf when diverged)"),
    ContractMetric("ragpool_train_tokens_per_second", "gauge", _TRAIN, "training", "tokens per second of this rank"),
    ContractMetric("ragpool_train_samples_per_second", "gauge", _TRAIN, "training", "samples per second of this rank"),
    ContractMetric("ragpool_train_step_duration_seconds", "histogram", _TRAIN, "training", "wall time of one step"),
    ContractMetric("ragpool_checkpoint_last_success_timestamp_seconds", "gauge", _TRAIN, "training",
                   "unix time the last checkpoint completed (0 before the first)"),
    ContractMetric("ragpool_checkpoint_duration_seconds", "histogram", _TRAIN, "training",
                   "wall time to write one checkpoint"),
    ContractMetric("ragpool_gpu_memory_allocated_bytes", "gauge", _TRAIN, "training", "CUDA memory allocated (CUDA only)"),
    ContractMetric("ragpool_train_world_size", "gauge", _TRAIN, "training",
                   "ranks the stage trains on (an elastic run's world size, changing at each resize)"),
    ContractMetric("ragpool_train_min_world_size", "gauge", _TRAIN, "training",
                   "fewest ranks the stage may train on: an elastic run's nodes.min x ranks per node (a fixed-size "
                   "run's world size)"),
    ContractMetric("ragpool_queue_depth", "gauge", ("priority",), "queue", "tasks waiting"),
    ContractMetric("ragpool_queue_oldest_age_seconds", "gauge", ("priority",), "queue", "age of the oldest waiting task"),
    ContractMetric("ragpool_queue_running", "gauge", (), "queue", "tasks under a lease"),
    ContractMetric("ragpool_queue_retries_total", "counter", (), "queue", "task retries"),
    ContractMetric("ragpool_queue_dead_letter_size", "gauge", (), "queue", "tasks in the dead-letter list"),
    ContractMetric("ragpool_queue_tasks_completed_total", "counter", ("outcome",), "queue",
                   "finished tasks; outcome=succeeded|failed|dead|cancelled"),
    ContractMetric("ragpool_task_duration_seconds", "histogram", ("outcome",), "queue", "wall time of one task"),
    ContractMetric("ragpool_worker_health_check_failed", "gauge", ("worker", "node", "check"), "queue",
                   "1 per failed check of a worker's pre-flight node health check (served about a minute, "
                   "then the worker exits HEALTH_CHECK_FAILED)"),
    ContractMetric("ragpool_worker_last_heartbeat_timestamp_seconds", "gauge", ("worker",), "queue",
                   "unix time of a worker's last heartbeat"),
    # Per lane (contract/lanes.py), served by the keeper for every queue namespace it keeps.
    ContractMetric("ragpool_lane_queued", "gauge", ("queue", "lane"), "queue",
                   "runs waiting in a lane's ready lists, all priorities: the runs that need a worker of the lane"),
    ContractMetric("ragpool_lane_running", "gauge", ("queue", "lane"), "queue", "runs of a lane under a lease"),
    ContractMetric("ragpool_lane_workers", "gauge", ("queue", "lane", "state"), "queue",
                   "live workers registered for a lane; state=waiting|running|exiting"),
    ContractMetric("ragpool_gang_timeouts_total", "counter", ("queue", "lane"), "queue",
                   "multi-node gangs whose pods did not all join within the gang deadline (run handed back, "
                   "no attempt spent)"),
    ContractMetric("ragpool_keeper_last_tick_timestamp_seconds", "gauge", (), "queue",
                   "unix time of the keeper's last successful tick (reap + due retries)"),
)

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def contract_by_name() -> dict[str, ContractMetric]:
    """The contract keyed by family name."""
    return {m.name: m for m in CONTRACT}


def exposed_series_names() -> dict[str, ContractMetric]:
    """Every series name a scrape of the ragpool exporters can return, mapped to its family."""
    out: dict[str, ContractMetric] = {}
    for metric in CONTRACT:
        if metric.type == "histogram":
            for suffix in _HISTOGRAM_SUFFIXES:
                out[metric.name + suffix] = metric
        else:
            out[metric.name] = metric
    return out
