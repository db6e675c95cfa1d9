"""FSDP2 sharding of a stage's model (``parallelism.strategy: fsdp | hsdp``), torchtitan-style.

:func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` to every decoder block of
the Hugging Face model (the classes its ``_no_split_modules`` names: ``LlamaDecoderLayer``,
``GPT2Block``, ...), then to the root, over a 1-D device mesh (``fsdp``: shard over all ranks)
or a 2-D one (``hsdp``: ``(nodes, gpus per node)``, replicate across nodes, shard within).
Parameters become ``DTensor`` shards on dim 0; the gradients, and so the AdamW state built
after sharding, are shards too. FSDP2 averages gradients over the ranks as DDP does, so the
loop's loss normalisation is the same math. With one rank nothing is sharded.

:func:`full_model_state` gathers the full state dict to rank 0's CPU memory one tensor at a
time (``full_state_dict`` + ``cpu_offload``), so no GPU ever holds the whole model.
"""

from __future__ import annotations

from typing import Any

import torch

from training.components.distributed import DistEnv
from training.components.logs import get_logger
from training.config import ConfigError, ParallelismConfig


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
