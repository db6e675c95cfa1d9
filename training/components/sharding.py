"""FSDP2 sharding of a stage's model (``parallelism.strategy: fsdp | hsdp``), torchtitan-style.

:func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` to every decoder block of
the Hugging Face model (the classes its ``_no_split_modules`` names: ``LlamaDecoderLayer``,
``GPT2Block``, ...), then to the root, over a 1-D device mesh (``fsdp``: shard over all ranks)
or a 2-D one (``hsdp``: ``(nodes, gpus per node)``, replicate across nodes, shard within).
Parameters become ``DTensor`` shards on dim 0; the gradients, and so the AdamW state built
after sharding, are shards too. FSDP2 averages gradients over the ranks as DDP does, so the
loop's loss normalisation is the same math. With one rank nothing is sharded.

:func:`params_on_meta` + :func:`load_safetensors_sharded` load a pretrained model without a full
copy per rank: built with meta parameters, sharded, then each rank reads only its slices.

:func:`full_model_state` gathers the full state dict to rank 0's CPU memory one tensor at a
time (``full_state_dict`` + ``cpu_offload``), so no GPU ever holds the whole model.

What each rank then holds per strategy, and the submit-time check against the pool's GPU memory:
training/rank_memory.py (torch-free, so ``ragpool submit`` can use it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from training.components.distributed import DistEnv
from training.components.logs import get_logger
from training.config.sections import ConfigError, ParallelismConfig


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class a Hugging Face model in ``model`` lists in
    ``_no_split_modules`` (the unit HF keeps on one device), outermost first, nested ones skipped."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    blocks: list[torch.nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():
        if id(m) in inside:
            continue
        if type(m).__name__ in names and not type(m).__name__.endswith("Embeddings"):
            blocks.append(m)
            inside.update(id(c) for c in m.modules())
    return blocks


def _hf_models(model: torch.nn.Module) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "activation_checkpointing_enable")]


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder block in backward (Hugging Face's per-layer checkpointing,
    non-reentrant so it composes with FSDP2's hooks and keeps parameter names unchanged)."""
    hf = _hf_models(model)
    if not hf or not decoder_blocks(model):
        raise ConfigError("parallelism.activation_checkpointing=True: the model has no decoder blocks "
                          "to checkpoint", "parallelism.activation_checkpointing")
    hf[0].activation_checkpointing_enable({"use_reentrant": False})


def device_mesh(env: DistEnv, strategy: str) -> Any:
    """``fsdp``: all ranks on one dimension; ``hsdp``: ``(replicate, shard)`` = (nodes, ranks per node)."""
    from torch.distributed.device_mesh import init_device_mesh

    if strategy == "hsdp":
        per_node = env.local_world_size
        if per_node < 1 or env.world_size % per_node:
            raise ConfigError(f"parallelism.strategy='hsdp': world size {env.world_size} does not divide into "
                              f"nodes of {per_node} ranks", "parallelism.strategy")
        return init_device_mesh(env.device.type, (env.world_size // per_node, per_node),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("shard",))


def shard_model(model: torch.nn.Module, par: ParallelismConfig, env: DistEnv, stage: str) -> torch.nn.Module:
    """Apply ``par`` to ``model`` (already on ``env.device``) in place and return it.

    ``ddp`` only turns on activation checkpointing when asked (DDP wraps later, in the loop).
    ``fsdp``/``hsdp``: ``fully_shard`` per decoder block, then the root; bf16 compute with fp32
    gradient reduction on GPU when ``mixed_precision``. Refuses a model without blocks.
    """
    log = get_logger(stage, env.is_main)
    if par.activation_checkpointing:
        enable_activation_checkpointing(model)
    if not par.sharded:
        return model
    blocks = decoder_blocks(model)
    if not blocks:
        raise ConfigError(f"parallelism.strategy={par.strategy!r}: the {stage} model "
                          f"({type(model).__name__}) has no decoder blocks to shard; use ddp",
                          "parallelism.strategy")
    if not env.distributed:
        log.warning("parallelism.strategy=%s with one rank: training unsharded (checkpoints stay DCP, "
                    "so the run can resume at any world size)", par.strategy)
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if par.mixed_precision and env.device.type == "cuda" else MixedPrecisionPolicy()
    mesh = device_mesh(env, par.strategy)
    kind = type(blocks[0]).__name__  # before fully_shard renames the class FSDP<kind>
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=par.reshard_after_forward, mp_policy=mp)
    # The root keeps its (embedding, final norm, tied head) parameters gathered after forward:
    # backward needs them first (FSDP2's default for the root).
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp)
    log.info("fully_shard: %d %s blocks + root over mesh %s", len(blocks), kind,
             tuple(mesh.shape))
    return model


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Build a model whose parameters live on the meta device (no memory) while its buffers stay real
    (rotary tables and other non-persistent buffers are computed in ``__init__`` and in no checkpoint):
    each parameter is moved to meta as its module registers it."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:  # a meta one is re-registered as is: ties stay ties
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _safetensors_files(source: Path) -> dict[str, Path]:
    """Tensor name -> the ``.safetensors`` file of a Hugging Face directory holding it."""
    index = source / "model.safetensors.index.json"
    if index.is_file():
        return {k: source / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = source / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{source}: no model.safetensors(.index.json) to load shard by shard")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as fh:
        return {k: single for k in fh.keys()}


#: safetensors dtype names (the format's header) -> torch dtypes.
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def _safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """``(offset of the data, header)`` of a safetensors file: an 8-byte little-endian header length,
    then the JSON header (name -> dtype, shape, data_offsets relative to the data)."""
    with path.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return 8 + n, json.loads(fh.read(n))


def _read_rows(fd: int, start: int, out: torch.Tensor) -> None:
    """Fill contiguous CPU ``out`` with the bytes at ``start`` of ``fd`` (pread: page cache, no mapping,
    so nothing but ``out`` counts towards this process's memory)."""
    view = memoryview(out.view(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], start + done)
        if got <= 0:
            raise OSError(f"short read at byte {start + done}")
        done += got


def load_safetensors_sharded(model: torch.nn.Module, device: torch.device, source: Path, prefix: str = "") -> None:
    """Allocate a (sharded) meta-device ``model`` on ``device`` and fill each parameter with only this
    rank's rows of it (FSDP2 shards dim 0, so they are one contiguous byte range of the safetensors
    file, read with ``pread``): no rank ever reads, maps or holds a tensor slice it does not own, let
    alone the whole model. ``prefix`` is the part of the parameter names that the files lack (a
    wrapper's ``lm.``)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    holders: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for pname, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, pname))
    model.to_empty(device=device)
    for (first, first_name), *others in (h for h in holders.values() if len(h) > 1):
        tied = getattr(first, first_name)  # to_empty gives each holder its own tensor: tie them again
        for module, pname in others:
            if getattr(module, pname) is not tied:
                setattr(module, pname, tied)
    files = _safetensors_files(Path(source))
    headers = {f: _safetensors_header(f) for f in set(files.values())}
    fds: dict[Path, int] = {}
    try:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
            for name, p in model.named_parameters():
                key = name.removeprefix(prefix)
                if key not in files:
                    raise KeyError(f"{source}: no tensor {key!r} in the safetensors files")
                path = files[key]
                base, header = headers[path]
                meta = header[key]
                if list(meta["shape"]) != list(p.shape):
                    raise ValueError(f"{source}: {key} has shape {meta['shape']}, the model {list(p.shape)}")
                if isinstance(p, DTensor):
                    local = p.to_local()
                    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                else:
                    local, shape, offset = p, tuple(p.shape), (0,) * p.ndim
                if not local.numel():
                    continue
                if any(offset[1:]) or tuple(shape[1:]) != tuple(p.shape[1:]):
                    raise ValueError(f"{key}: only dim-0 shards load row by row (placements {p.placements})")
                dtype = _SAFETENSORS_DTYPES[meta["dtype"]]
                direct = local.dtype == dtype and local.device.type == "cpu" and local.is_contiguous()
                buf = local if direct else torch.empty(tuple(shape), dtype=dtype)
                row_bytes = buf[0].numel() * buf.element_size() if buf.ndim else buf.element_size()
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY)
                _read_rows(fds[path], base + meta["data_offsets"][0] + offset[0] * row_bytes, buf)
                if not direct:
                    local.copy_(buf)
    finally:
        for fd in fds.values():
            os.close(fd)


def is_sharded(model: torch.nn.Module) -> bool:
    """The model's parameters are FSDP2 DTensor shards."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """FSDP2's ``no_sync``: skip the reduce-scatter on accumulation micro-steps (all but the last)."""
    model.set_requires_gradient_sync(sync)  # type: ignore[operator]


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state on rank 0's CPU, gathered tensor by tensor; ``{}`` on other
    ranks. A collective when the model is sharded: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (local shards only)."""
    from torch.distributed.tensor import DTensor

    def nbytes(t: Any) -> int:
        if isinstance(t, DTensor):
            t = t.to_local()
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    params = list(model.parameters())
    return {"params": sum(nbytes(p) for p in params),
            "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(nbytes(v) for s in optimizer.state.values() for v in s.values())}
