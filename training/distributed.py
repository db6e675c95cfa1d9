"""Process-group setup from torchrun's environment, and the few collectives we need.

Works three ways: under ``torchrun`` (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR set),
as a plain single process (no process group at all), and on CPU or CUDA
(backend NCCL on CUDA, gloo on CPU, chosen automatically).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    """Global rank of this process."""
    world_size: int
    """Number of processes in the job."""
    local_rank: int
    """Rank on this node (selects the GPU and the metrics port offset)."""
    local_world_size: int
    """Processes on this node."""
    device: torch.device
    """Device this rank computes on."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that logs and writes shared state."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group is initialised (world size > 1)."""
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()


def init_distributed(device: str = "auto", timeout_s: int = 1800) -> DistEnv:
    """Initialise from torchrun env vars; a no-op single-process env without them.

    ``device``: ``auto`` picks CUDA when available. Also bounds CPU threads per
    process so N ranks on one host do not oversubscribe its cores.
    """
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device=cuda requested but CUDA is not available")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ or local_world > 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
        if use_cuda:
            kwargs["device_id"] = dev
        dist.init_process_group(**kwargs)
    return DistEnv(rank, world, local_rank, local_world, dev)


def bf16_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201
    """DDP comm hook: average a gradient bucket as bf16 (half the bytes of fp32).

    What PyTorch's ``bf16_compress_hook`` does, which refuses to register without
    NCCL; this one also runs on gloo (CPU jobs, and the tests). Unannotated on purpose:
    DDP rejects a hook whose annotations are not the real ``dist.GradBucket`` /
    ``Future`` types, and this module's annotations are strings.
    """
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(f: "torch.futures.Future[list[torch.Tensor]]") -> torch.Tensor:
        buf.copy_(f.value()[0])
        return buf

    return fut.then(decompress)


def wrap_ddp(model: torch.nn.Module, env: DistEnv, grad_compression: str = "none",
             bucket_cap_mb: int = 25) -> torch.nn.Module:
    """``model`` in DistributedDataParallel when distributed, else itself.

    Gradients are views into DDP's buckets (no copy per step); buffers are not broadcast
    every forward (transformers have none that change). ``grad_compression="bf16"``
    all-reduces bf16 copies of the gradient buckets (see :func:`bf16_allreduce_hook`).
    """
    if not env.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs: dict[str, Any] = {"broadcast_buffers": False, "gradient_as_bucket_view": True,
                              "bucket_cap_mb": bucket_cap_mb}
    if env.device.type == "cuda":
        kwargs["device_ids"] = [env.local_rank]
    wrapped = DDP(model, **kwargs)
    if grad_compression == "bf16":
        wrapped.register_comm_hook(None, bf16_allreduce_hook)
    elif grad_compression != "none":
        raise ValueError(f"distributed.grad_compression={grad_compression!r}: must be none or bf16")
    return wrapped


def destroy() -> None:
    """Tear the process group down (safe when none exists)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        if env.device.type == "cuda":
            dist.barrier(device_ids=[env.local_rank])
        else:
            dist.barrier()


def all_reduce_max_int(env: DistEnv, value: int) -> int:
    """Maximum of an integer over ranks (e.g. "did any rank get SIGTERM")."""
    if not env.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_mean(env: DistEnv, t: torch.Tensor) -> torch.Tensor:
    """Mean of a tensor over ranks (a detached copy)."""
    t = t.detach().clone()
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= env.world_size
    return t


def broadcast_object(env: DistEnv, obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s Python object on every rank."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(env: DistEnv, obj: Any) -> list[Any]:
    """Every rank's object, indexed by rank."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sends each rank the gradient of *all* ranks' losses
    with respect to its own slice (sum over ranks).

    Implemented with all_gather + all_reduce so it runs on gloo too (gloo has no
    reduce_scatter). Paired with DDP's gradient averaging this gives exactly the
    gradient of the mean loss over the global batch.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        world = dist.get_world_size()
        ctx.rank = dist.get_rank()
        ctx.n = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n]


def all_gather_with_grad(env: DistEnv, x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` (same shape on every rank) from all ranks along dim 0, keeping gradients."""
    if not env.distributed:
        return x
    return _GatherWithGrad.apply(x)


def all_gather_variable(env: DistEnv, x: torch.Tensor) -> torch.Tensor:
    """Concatenate tensors whose first dimension differs per rank (no gradient)."""
    if not env.distributed:
        return x
    sizes = all_gather_object(env, int(x.shape[0]))
    biggest = max(sizes)
    padded = torch.zeros((biggest, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(env.world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)], dim=0)
