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

from training.config.sections import GradCompression
from training.config.sections import SparseEmbeddingGrads as SparseEmbeddingGradsMode


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


def bf16_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
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


class SparseEmbeddingGrads:
    """State of :func:`sparse_embedding_allreduce_hook`: the embedding tables it may send
    row by row, and the rows of each that this rank looked up since the last all-reduce.

    A table qualifies when it is an ``nn.Embedding`` with at least ``min_rows`` rows whose
    weight no other module holds (a weight tied to an output layer gets a dense gradient).
    Its gradient is non-zero only on looked-up rows, so averaging the union of all ranks'
    rows gives the same gradient as averaging the whole table: all-MiniLM-L6-v2's 30522 x 384
    word embeddings are half its parameters, of which a batch touches a few percent.
    The first all-reduce checks that claim (a table used outside its module's forward
    would break it) and raises instead of training on a wrong gradient.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.float32, min_rows: int = 1024) -> None:
        self.dtype = dtype
        """Dtype the gradients travel in (float32, or bfloat16 for grad_compression=bf16)."""
        self.masks: dict[int, torch.Tensor] = {}
        """id(weight) -> uint8 mask of the rows looked up since the last all-reduce."""
        self.rows_sent = 0
        """Table rows all-reduced so far (all tables, all steps)."""
        self.rows_total = 0
        """Table rows a dense all-reduce would have sent."""
        self.checked = False
        holders: dict[int, int] = {}
        for module in model.modules():
            for p in module._parameters.values():
                if p is not None:
                    holders[id(p)] = holders.get(id(p), 0) + 1
        for module in model.modules():
            if (isinstance(module, torch.nn.Embedding) and not module.sparse and module.max_norm is None
                    and module.weight.requires_grad and module.num_embeddings >= min_rows
                    and holders[id(module.weight)] == 1):
                mask = torch.zeros(module.num_embeddings, dtype=torch.uint8, device=module.weight.device)
                self.masks[id(module.weight)] = mask
                module.register_forward_pre_hook(self._recorder(mask))

    @staticmethod
    def _recorder(mask: torch.Tensor) -> Any:
        def record(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            if torch.is_grad_enabled():
                mask[args[0].reshape(-1)] = 1
        return record


def _all_reduce_as(t: torch.Tensor, dtype: torch.dtype) -> None:
    """Sum ``t`` over ranks in place, travelling as ``dtype``."""
    if t.dtype == dtype:
        dist.all_reduce(t)
    else:
        wire = t.to(dtype)
        dist.all_reduce(wire)
        t.copy_(wire)


def sparse_embedding_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: average a gradient bucket, sending embedding tables' looked-up rows only.

    Buckets without a table go as DDP's default does (or as bf16, see ``state.dtype``).
    For a bucket holding a table, the rest of the bucket is all-reduced as usual, the ranks'
    row masks are OR-ed, and only those rows of the table are all-reduced: the same sums
    as the dense path (rows outside every mask are zero on every rank). Synchronous: a
    table's gradient is the last one backward produces, so there is nothing left to overlap.
    """
    buf = bucket.buffer()
    tables = []
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        if id(p) in state.masks:
            offset = (g.data_ptr() - buf.data_ptr()) // buf.element_size()
            if not 0 <= offset <= buf.numel() - p.numel():  # DDP hands out views into the bucket
                raise RuntimeError("DDP gradient is not a view into its bucket; set "
                                   "distributed.sparse_embedding_grads: never")
            tables.append((offset, p.shape, state.masks[id(p)]))
    if not tables:  # as without this hook: overlapped with the rest of backward
        if state.dtype != buf.dtype:
            return bf16_allreduce_hook(None, bucket)
        buf.div_(dist.get_world_size())
        return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])
    buf.div_(dist.get_world_size())
    tables.sort(key=lambda t: t[0])
    start = 0
    for offset, shape, _ in tables:  # the dense spans between tables
        if offset > start:
            _all_reduce_as(buf[start:offset], state.dtype)
        start = offset + shape.numel()
    if start < buf.numel():
        _all_reduce_as(buf[start:], state.dtype)
    grads = [buf[offset:offset + shape.numel()].view(shape) for offset, shape, _ in tables]
    # One more entry per table: 1 where this rank's gradient has rows its forward never
    # looked up (checked on the first all-reduce only), so every rank learns of it and
    # all of them stop instead of one waiting for the others in the next collective.
    masks = [mask for _, _, mask in tables]
    flags = [int(not state.checked and bool(g[m == 0].ne(0).any())) for g, m in zip(grads, masks)]
    looked_up = torch.cat(masks + [torch.tensor(flags, dtype=torch.uint8, device=buf.device)])
    dist.all_reduce(looked_up, op=dist.ReduceOp.MAX)  # union of the ranks' rows (and flags)
    if looked_up[-len(tables):].any():
        raise RuntimeError("an embedding table has gradient on rows no forward looked up: it is used "
                           "outside its module; set distributed.sparse_embedding_grads: never")
    at = 0
    for grad, (_, shape, mask) in zip(grads, tables, strict=True):
        union = looked_up[at:at + shape[0]]
        at += shape[0]
        rows = union.nonzero().squeeze(1)
        sent = grad.index_select(0, rows)
        _all_reduce_as(sent, state.dtype)
        grad.index_copy_(0, rows, sent)
        state.rows_sent += rows.numel()
        state.rows_total += shape[0]
        mask.zero_()
    state.checked = True
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)
    fut.set_result(buf)
    return fut


def wrap_ddp(model: torch.nn.Module, env: DistEnv, grad_compression: GradCompression = "none",
             bucket_cap_mb: int = 25, sparse_embedding_grads: SparseEmbeddingGradsMode = "auto") -> torch.nn.Module:
    """``model`` in DistributedDataParallel when distributed, else itself.

    Gradients are views into DDP's buckets (no copy per step); buffers are not broadcast
    every forward (transformers have none that change). ``grad_compression="bf16"``
    all-reduces bf16 copies of the gradient buckets (see :func:`bf16_allreduce_hook`);
    ``sparse_embedding_grads`` (``auto``: on with gloo, off with NCCL) sends only the
    looked-up rows of embedding tables (see :class:`SparseEmbeddingGrads`).
    """
    if not env.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs: dict[str, Any] = {"broadcast_buffers": False, "gradient_as_bucket_view": True,
                              "bucket_cap_mb": bucket_cap_mb}
    if env.device.type == "cuda":
        kwargs["device_ids"] = [env.local_rank]
    wrapped = DDP(model, **kwargs)
    sparse = sparse_embedding_grads == "always" or (sparse_embedding_grads == "auto" and env.device.type == "cpu")
    state = SparseEmbeddingGrads(model, torch.bfloat16 if grad_compression == "bf16" else torch.float32) \
        if sparse else None
    if state is not None and state.masks:
        wrapped.register_comm_hook(state, sparse_embedding_allreduce_hook)
        wrapped.sparse_embedding_grads = state  # rows_sent / rows_total, for tests and the curious
    elif grad_compression == "bf16":
        wrapped.register_comm_hook(None, bf16_allreduce_hook)
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
