"""Training-state memory per rank, per parallelism strategy (torch-free; the one home of the arithmetic).

docs/TRAINING.md "Training a large generator" quotes this; ``ragpool submit`` refuses a stage whose state cannot
fit the pool's GPUs with it (training/scheduler/fit.py). AdamW with fp32 master weights keeps, per
parameter, :data:`BYTES_PER_PARAMETER` bytes: 4 (parameter) + 4 (gradient) + 8 (AdamW ``exp_avg`` and
``exp_avg_sq``) = 16. ``ddp`` holds all of it on every rank; ``fsdp`` and ``hsdp`` shard it over their
shard group (:func:`shard_group`: every rank for ``fsdp``, the GPUs of one node for ``hsdp``), so a rank
holds ``16 * P / group`` bytes (``ceil``).

The check is a lower bound: the state alone must fit :data:`USABLE_FRACTION` of one GPU's memory (the
rest is the CUDA context, NCCL buffers and the allocator's slack). Activations, and under fsdp/hsdp the
one or two gathered blocks in bf16, come on top and depend on the batch, the sequence length and
activation checkpointing, so a refused stage cannot fit and an accepted one may still run out of memory.

Host memory (:func:`host_fits`): a GPU worker pod's memory limit (``RAGPOOL_POOL_GPUS`` ``:mem<M>GiB``,
sized from the instance's RAM by infra/gpu_memory.py) must hold the two host-memory peaks a training stage
adds, measured on CPU by ``python bench/fsdp_memory.py --host-memory`` (docs/DESIGN.md "Host memory of a
training stage"): every checkpoint stages each rank's parameter and AdamW shards in CPU memory
(:data:`HOST_STAGING_BYTES_PER_PARAMETER` per parameter of the shard, on every rank of the pod at once;
under ``ddp`` rank 0 alone snapshots its whole state), and the end of a sharded stage gathers the full
fp32 model on rank 0's CPU and writes it (:data:`HOST_GATHER_BYTES_PER_PARAMETER` per parameter of the
model). The larger of the two must fit :data:`USABLE_FRACTION` of the pod's memory (the rest: each rank's
process, CUDA context and data loader). A lower bound too.

The parameter count of a Hugging Face model directory (:func:`model_parameters`): exact from the
headers of its ``*.safetensors`` files (the JSON header lists every tensor's shape; no tensor is read),
else estimated from ``config.json`` for a decoder-only transformer (:func:`config_parameters`).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BYTES_PER_PARAMETER = {"parameters": 4, "gradients": 4, "adamw_state": 8}
"""fp32 parameter, fp32 gradient, AdamW's two fp32 moments: 16 bytes per parameter in all."""
STATE_BYTES_PER_PARAMETER = sum(BYTES_PER_PARAMETER.values())
USABLE_FRACTION = 0.9
"""Share of one GPU's memory the training state may take (the check's headroom: 10 %)."""
GIB = 2**30
HOST_STAGING_BYTES_PER_PARAMETER = 12.1
"""Host-memory peak of one background DCP save per parameter of a rank's shard (fp32 parameter 4 + AdamW 8,
staged to CPU, and the writer's buffers): 12.09 measured (bench/fsdp_memory.py --host-memory)."""
HOST_GATHER_BYTES_PER_PARAMETER = 6.0
"""Host-memory peak on rank 0 per parameter of the model at the end of a sharded stage (the full fp32 model
gathered to its CPU, then save_pretrained of it): 6.00 measured (bench/fsdp_memory.py --host-memory)."""
MAX_HEADER_BYTES = 100 * 2**20
"""A safetensors header longer than this is refused (the format's own limit is 100 MB)."""


class ModelSizeError(ValueError):
    """The model directory does not say its size (no readable safetensors header nor config.json)."""


def shard_group(strategy: str, world: int, gpus_per_node: int) -> int:
    """Ranks that share one copy of the training state: 1 for ``ddp``, the world for ``fsdp``,
    the GPUs of one node for ``hsdp`` (it replicates across nodes)."""
    if strategy == "ddp":
        return 1
    if strategy == "hsdp":
        return max(1, gpus_per_node)
    return max(1, world)


def state_bytes_per_rank(parameters: int, strategy: str, world: int, gpus_per_node: int) -> int:
    """Bytes of parameters, gradients and AdamW state one rank holds (16 * P / shard group)."""
    return math.ceil(STATE_BYTES_PER_PARAMETER * parameters / shard_group(strategy, world, gpus_per_node))


def fits(parameters: int, strategy: str, world: int, gpus_per_node: int, gpu_gib: float) -> tuple[bool, str]:
    """Whether the state per rank fits :data:`USABLE_FRACTION` of a ``gpu_gib`` GiB GPU, and the
    arithmetic as one line (what a refusal quotes)."""
    group = shard_group(strategy, world, gpus_per_node)
    need = state_bytes_per_rank(parameters, strategy, world, gpus_per_node)
    usable = USABLE_FRACTION * gpu_gib * GIB
    over = "" if group == 1 else f" / {group} ranks"
    line = (f"{strategy}: {parameters / 1e9:.2f}e9 parameters x {STATE_BYTES_PER_PARAMETER} B "
            f"(fp32 parameter 4 + gradient 4 + AdamW 8){over} = {need / GIB:.1f} GiB per rank, "
            f"{'within' if need <= usable else 'more than'} {usable / GIB:.1f} GiB usable "
            f"({USABLE_FRACTION:.0%} of {gpu_gib:g} GiB per GPU), before activations")
    return need <= usable, line


def host_bytes_per_pod(parameters: int, strategy: str, world: int, gpus_per_node: int,
                       ranks_per_pod: int) -> tuple[int, int]:
    """``(staging, gather)``: host bytes a worker pod holds while a checkpoint is staged (every sharded rank
    of the pod at once; rank 0 alone under ``ddp``), and rank 0's while the stage's model is gathered."""
    group = shard_group(strategy, world, gpus_per_node)
    stagers = 1 if strategy == "ddp" else max(1, ranks_per_pod)
    staging = stagers * math.ceil(HOST_STAGING_BYTES_PER_PARAMETER * parameters / group)
    return staging, math.ceil(HOST_GATHER_BYTES_PER_PARAMETER * parameters)


def host_fits(parameters: int, strategy: str, world: int, gpus_per_node: int, ranks_per_pod: int,
              pod_gib: float) -> tuple[bool, bool, str]:
    """``(staging fits, gather fits, arithmetic)``: whether each host-memory peak fits
    :data:`USABLE_FRACTION` of a ``pod_gib`` GiB worker pod, and the arithmetic as one line."""
    group = shard_group(strategy, world, gpus_per_node)
    staging, gather = host_bytes_per_pod(parameters, strategy, world, gpus_per_node, ranks_per_pod)
    usable = USABLE_FRACTION * pod_gib * GIB
    stagers = "rank 0" if strategy == "ddp" else f"{max(1, ranks_per_pod)} rank(s) of the pod"
    over = "" if group == 1 else f" / {group} ranks"
    line = (f"{strategy}: checkpoint staging {stagers} x {parameters / 1e9:.2f}e9 parameters x "
            f"{HOST_STAGING_BYTES_PER_PARAMETER:g} B{over} = {staging / GIB:.1f} GiB, rank-0 gather "
            f"{parameters / 1e9:.2f}e9 x {HOST_GATHER_BYTES_PER_PARAMETER:g} B = {gather / GIB:.1f} GiB of host "
            f"memory, against {usable / GIB:.1f} GiB usable ({USABLE_FRACTION:.0%} of the {pod_gib:g} GiB "
            f"memory limit of a worker pod)")
    return staging <= usable, gather <= usable, line


def _safetensors_parameters(path: Path) -> int:
    """Elements of every tensor in one safetensors file, from its header alone."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ModelSizeError(f"{path.name}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise ModelSizeError(f"{path.name}: header of {length} bytes, more than {MAX_HEADER_BYTES}")
        try:
            header = json.loads(f.read(length))
        except ValueError as err:
            raise ModelSizeError(f"{path.name}: header is not JSON ({err})") from None
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, Mapping) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ModelSizeError(f"{path.name}: tensor {name[:80]!r} has no shape")
        total += math.prod(shape)
    return total


def config_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its Hugging Face ``config.json``: token embeddings
    (``vocab_size x hidden_size``, once more when ``tie_word_embeddings`` is false), and per layer the
    attention projections (q and o: h x h; k and v: h x h x kv_heads / heads) plus the MLP
    (3 x h x intermediate_size for the gated MLPs of Llama/Mistral/Qwen, 2 x when ``hidden_act`` is
    gelu-like with no gate: GPT-2 style; GPT-2's ``n_embd``/``n_layer``/``n_inner`` are read too).
    Norms and biases are left out (under 0.1 % of a 1B+ model)."""
    def get(*names: str) -> Any:
        return next((config[n] for n in names if isinstance(config.get(n), int) and config[n] > 0), None)

    h, layers, vocab = get("hidden_size", "n_embd", "d_model"), get("num_hidden_layers", "n_layer"), get("vocab_size")
    if not (h and layers and vocab):
        raise ModelSizeError("config.json names no hidden_size, num_hidden_layers and vocab_size")
    heads = get("num_attention_heads", "n_head") or 1
    kv = get("num_key_value_heads") or heads
    gpt2 = "n_embd" in config
    inner = get("intermediate_size", "n_inner") or 4 * h
    mlp = (2 if gpt2 else 3) * h * inner
    attention = 2 * h * h + 2 * h * (h * kv // heads)
    tied = config.get("tie_word_embeddings", gpt2)
    return vocab * h * (1 if tied else 2) + layers * (attention + mlp)


def model_parameters(model_dir: str | Path) -> tuple[int, str]:
    """``(parameters, how)`` of a Hugging Face model directory: exact from its safetensors headers,
    else estimated from its config.json. Raises :class:`ModelSizeError` when it says neither."""
    root = Path(model_dir)
    files = sorted(root.glob("*.safetensors"))
    if files:
        return sum(_safetensors_parameters(p) for p in files), f"the headers of {len(files)} safetensors file(s)"
    config = root / "config.json"
    try:
        data = json.loads(config.read_text())
    except OSError as err:
        raise ModelSizeError(f"no *.safetensors and no readable config.json ({err.strerror})") from None
    except ValueError as err:
        raise ModelSizeError(f"config.json is not JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise ModelSizeError("config.json is not a JSON object")
    return config_parameters(data), "config.json (decoder-only estimate)"
