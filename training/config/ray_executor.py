"""The Ray executor's sections of a run config (``ray:``): the cluster to join, each stage's resources and pool,
failures, and the Ray Tune search. Read by ``python -m training.ray.driver`` and ``ragpool tune``; checked at submit
time like every section (pure Python, no Ray)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Literal

from contract.messages import shown
from contract.paths import is_valid_run_id
from training.config.sections import STAGES, ConfigError, fail, require

RayStrategy = Literal["auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""Placement-group strategies (Ray's four, plus ``auto``: see :class:`RayStageConfig.strategy`)."""
RAY_STAGES: tuple[str, ...] = ("prepare", *STAGES)
"""Stages the Ray driver places: data preparation, then the pipeline's stages."""
RAY_TRAIN_STAGES: tuple[str, ...] = ("retriever", "generator")
"""Stages that run as Ray Train worker groups (DDP); the others run as Ray tasks."""
RAY_POOL_RULE = "empty (any node) or a pool name: 1-63 lowercase letters, digits or '-', starting and ending alphanumeric"
TUNE_METRIC_RULE = "mrr or recall@K with K one of evaluate.recall_at"
TuneSearch = Literal["off", "only", "then_run"]
_TUNE_METRIC = re.compile(r"mrr|recall@[0-9]{1,6}")


@dataclass
class RayStageConfig:
    """Resources one stage reserves under the Ray executor (a placement group per stage)."""

    pool: str = ""
    """Pool whose nodes carry the stage: Ray nodes labelled ``ragpool.io/pool=<pool>``; empty = any node.
    A stage never lands on another pool."""
    workers: int = 1
    """retriever/generator: Ray Train workers (DDP ranks); prepare/index/evaluate: parallel Ray tasks. A training
    stage may give a range, ``workers: {min: M, max: N}``: elastic (Ray Train's ``num_workers=(M, N)``), it trains
    on as many of N workers as the pool has room for, never fewer than M; ``workers`` is then N."""
    min_workers: int = 0
    """An elastic training stage's fewest workers (``workers: {min, max}`` sets it); 0 = a fixed ``workers``."""
    cpus: float = 1.0
    """CPUs reserved per worker or task (one placement-group bundle each)."""
    gpus: int = 0
    """Whole GPUs reserved per worker or task (0 = CPU only)."""
    strategy: RayStrategy = "auto"
    """Placement-group strategy; ``auto`` = STRICT_PACK for training workers when they all fit one node
    of the pool (else PACK), SPREAD for the task stages."""

    @property
    def elastic(self) -> bool:
        """A range of workers (``workers: {min, max}`` with min < max)."""
        return 0 < self.min_workers < self.workers

    @classmethod
    def normalize_tree(cls, data: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
        """``workers: {min: M, max: N}`` as the fields hold it (``workers`` N, ``min_workers`` M; min == max is
        the fixed size N); errors name ``<prefix>workers.min`` / ``.max``. Called by the config loader."""
        value = data.get("workers") if isinstance(data, Mapping) else None
        if not isinstance(value, Mapping):
            return data
        key = f"{prefix}workers"
        unknown = sorted(str(k) for k in value if k not in ("min", "max"))
        if unknown:
            fail(key, dict(value), f"unknown key(s) {', '.join(unknown)}: give workers: {{min: M, max: N}} or an "
                                   "integer")
        missing = [k for k in ("min", "max") if k not in value]
        if missing:
            fail(key, dict(value), f"a range needs min and max; missing {', '.join(missing)}")
        if "min_workers" in data:
            fail(f"{prefix}min_workers", data["min_workers"], f"set by {key}: {{min, max}}; give one of them")
        lo, hi = (_whole(f"{key}.{k}", value[k]) for k in ("min", "max"))
        require(1 <= lo, f"{key}.min", lo, "must be >= 1")
        require(lo <= hi, f"{key}.min", lo, f"must be <= {key}.max ({hi})")
        return {**data, "workers": hi, "min_workers": lo if lo < hi else 0}

    def __post_init__(self) -> None:
        require(self.pool == "" or is_valid_run_id(self.pool), "pool", self.pool, f"must be {RAY_POOL_RULE}")
        require(1 <= self.workers <= 1024, "workers", self.workers, "must be in [1, 1024]")
        require(0 <= self.min_workers <= self.workers, "workers.min", self.min_workers,
                f"must be in [1, workers.max] ([1, {self.workers}])")
        require(0 <= self.cpus <= 512, "cpus", self.cpus, "must be in [0, 512]")
        require(0 <= self.gpus <= 16, "gpus", self.gpus, "must be in [0, 16] (whole GPUs)")
        require(self.cpus > 0 or self.gpus > 0, "cpus", self.cpus, "a worker must reserve a CPU or a GPU")


@dataclass
class TuneConfig:
    """Ray Tune search over the retriever's hyper-parameters (``ragpool tune``), ASHA early stopping."""

    num_samples: int = 4
    """Trials to run."""
    lr: tuple[float, float] = (1.0e-5, 2.0e-4)
    """Learning-rate range ``[low, high]``, sampled log-uniformly."""
    temperature: tuple[float, float] = (0.02, 0.1)
    """Contrastive temperature range ``[low, high]``, sampled uniformly."""
    global_batch_size: tuple[int, ...] = (8, 16)
    """Batch sizes to choose from (each a multiple of the workers times grad_accum)."""
    metric: str = "mrr"
    """What trials are ranked by on the eval split: ``mrr`` or ``recall@K``."""
    rungs: int = 2
    """ASHA milestones: each trial is evaluated (and may be stopped) after every 1/rungs of retriever.max_steps."""
    reduction_factor: int = 2
    """ASHA keeps the best 1/reduction_factor of the trials at each milestone."""
    max_concurrent: int = 0
    """Trials at once; 0 = as many as the cluster's GPUs (CPU workers on a CPU cluster) allow."""
    eval_questions: int = 0
    """Eval-split questions scored per milestone (0 = all)."""
    eval_passages: int = 20000
    """Passages a milestone's score searches: the scored questions' positives and a seeded sample of the
    others, the whole corpus when it is no larger (each milestone encodes them; a trial never holds a large
    corpus)."""
    search: TuneSearch = "off"
    """What a queued ``executor: ray`` run's Ray job runs (``ragpool tune`` through the run API sets it):
    ``off`` the run (training/ray/driver.py); ``only`` this search; ``then_run`` the search, then the whole run
    with the best parameters (``ragpool tune --start``)."""

    def __post_init__(self) -> None:
        require(1 <= self.num_samples <= 1000, "num_samples", self.num_samples, "must be in [1, 1000]")
        require(0 < self.lr[0] <= self.lr[1] < 1, "lr", self.lr, "must be [low, high] with 0 < low <= high < 1")
        require(0 < self.temperature[0] <= self.temperature[1] <= 10, "temperature", self.temperature,
                 "must be [low, high] with 0 < low <= high <= 10")
        require(len(self.global_batch_size) >= 1 and all(b >= 1 for b in self.global_batch_size),
                 "global_batch_size", self.global_batch_size, "must be a non-empty list of integers >= 1")
        require(_TUNE_METRIC.fullmatch(self.metric) is not None, "metric", self.metric, f"must be {TUNE_METRIC_RULE}")
        require(1 <= self.rungs <= 100, "rungs", self.rungs, "must be in [1, 100]")
        require(self.reduction_factor >= 2, "reduction_factor", self.reduction_factor, "must be >= 2")
        require(self.max_concurrent >= 0, "max_concurrent", self.max_concurrent, "must be >= 0 (0 = by GPUs)")
        require(self.eval_questions >= 0, "eval_questions", self.eval_questions, "must be >= 0 (0 = all)")
        require(self.eval_passages >= 1, "eval_passages", self.eval_passages, "must be >= 1")


@dataclass
class RayExecutorConfig:
    """The Ray executor (``python -m training.ray.driver``): cluster, per-stage resources, failures, Tune."""

    address: str = ""
    """Ray cluster to join: empty = ``RAY_ADDRESS`` when set (a Ray job), else start a local Ray;
    ``auto`` = the cluster already running on this machine; or ``host:port``."""
    placement_timeout_s: float = 600.0
    """How long a stage waits for room on its pool before it fails naming the stage, pool and resources."""
    max_failures: int = 2
    """Training stages: worker-group restarts Ray Train makes (``FailureConfig``); each resumes from the
    newest verified checkpoint. A node lost without notice is one (Ray cannot tell it from a crash); a preempted
    node (drained with Ray's preemption reason) and an elastic stage's resize are not."""
    resize_interval_s: float = 60.0
    """Elastic training stages (``workers: {min, max}``): how often Ray Train checks, while the stage runs below
    its max, whether the pool has room for more workers (``ScalingConfig.elastic_resize_monitor_interval_s``);
    growing restarts the worker group from the newest checkpoint."""
    elastic_start_timeout_s: float = 15.0
    """Elastic training stages: how long a worker group's (re)start waits for its placement before Ray Train plans
    the size again (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``, set for the stage; Ray's 60 s default stays for
    fixed-size stages). The elastic policy asks only for what the pool's nodes hold, so a start that waits was
    planned on a stale view: after a spot notice, the drained node still counted until it went."""
    prepare: RayStageConfig = field(default_factory=lambda: RayStageConfig(workers=3))
    """Data preparation: the data files validated as parallel CPU tasks."""
    retriever: RayStageConfig = field(default_factory=RayStageConfig)
    """Retriever fine-tuning (Ray Train workers)."""
    index: RayStageConfig = field(default_factory=lambda: RayStageConfig(workers=2))
    """Corpus encoding tasks (their shards are merged into one FAISS index)."""
    generator: RayStageConfig = field(default_factory=RayStageConfig)
    """Generator fine-tuning (Ray Train workers)."""
    evaluate: RayStageConfig = field(default_factory=RayStageConfig)
    """Evaluation task."""
    tune: TuneConfig = field(default_factory=TuneConfig)
    """Hyper-parameter search (``ragpool tune``)."""

    def __post_init__(self) -> None:
        require(0 < self.placement_timeout_s <= 7 * 86400, "placement_timeout_s", self.placement_timeout_s,
                 "must be in (0, 604800] seconds")
        require(0 <= self.max_failures <= 100, "max_failures", self.max_failures, "must be in [0, 100]")
        require(0 < self.resize_interval_s <= 86400, "resize_interval_s", self.resize_interval_s,
                 "must be in (0, 86400] seconds")
        require(0 < self.elastic_start_timeout_s <= 3600, "elastic_start_timeout_s", self.elastic_start_timeout_s,
                 "must be in (0, 3600] seconds")
        for name in RAY_STAGES:
            if name not in RAY_TRAIN_STAGES and self.stage(name).min_workers:
                fail(f"{name}.workers", {"min": self.stage(name).min_workers, "max": self.stage(name).workers},
                     f"a range is for the Ray Train stages ({', '.join(RAY_TRAIN_STAGES)}); {name} runs a fixed "
                     "number of tasks: give an integer")

    def stage(self, name: str) -> RayStageConfig:
        """The resources of stage ``name`` (one of :data:`RAY_STAGES`)."""
        if name not in RAY_STAGES:
            raise ConfigError(f"stage={shown(name)}: unknown stage; allowed: {', '.join(RAY_STAGES)}", "stage")
        return getattr(self, name)


def _whole(key: str, value: Any) -> int:
    """An integer of a range (YAML's or an override's string)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        fail(key, value, "must be an integer")
    return value
