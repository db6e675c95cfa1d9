"""FSDP2 versus DDP on this machine: state held per rank, step time, DCP save speed, resharding.
The last line printed is one JSON object.

    python bench/fsdp_memory.py [--quick] [--dir /tmp/ragpool-fsdp-bench]
    python bench/fsdp_memory.py --gpu        # on a CUDA machine: largest generator DDP vs FSDP fits, with MFU
    python bench/fsdp_memory.py --host-memory  # CPU: host-memory peak per parameter of an async DCP save + gather

CPU mode runs 2-rank torchrun jobs (gloo, one thread per rank) on the same Llama (``cpu`` shape of
bench/train_throughput.py, ~29M parameters) and batch under ``parallelism.strategy`` ddp and fsdp, with
the training loop's own wrappers (:func:`training.components.distributed.wrap_ddp`,
:func:`training.components.sharding.shard_model`) and optimizer. Keys:

  state_bytes_per_rank_ratio  parameter + gradient + AdamW-state bytes rank 0 holds under FSDP over DDP
                              (local shards' tensor bytes, after an optimizer step). Goal <= 0.55
  fsdp_vs_ddp_step_time       FSDP step time over DDP's (same model and batch, 2 ranks, one job, steps
                              interleaved; median of the per-step ratios of both ranks). Goal <= 1.25
  dcp_save_vs_raw             DCP checkpoint throughput (save_dcp_checkpoint: DCP files, checksums,
                              manifest, rename) over each rank writing + fsyncing the same local bytes
                              raw at the same time, for the ~135M-parameter Llama below with its AdamW
                              state (~0.8 GB per rank, so one save lasts seconds and a shared machine's
                              bursts average out): median of the per-pair ratios of 7 interleaved pairs
                              (3 with --quick), which goes first alternating; dcp_save_vs_raw_ratios
                              lists them all, so the noise is visible. Goal >= 0.8
  dcp_stall_ratio             the time one background DCP save (checkpoint.async_save: Checkpointer.save_dcp
                              as the loop calls it) holds the training loop (hand-off, waiting for the CPU
                              copy before the next optimizer step, waiting for the writer after the steps
                              that cover it; slowest rank, median of 3, 1 with --quick) over a blocking save's, which holds
                              it throughout (dcp_stall_seconds_blocking / _async). Goal <= 0.10, the
                              ckpt_stall_ratio goal of bench/train_throughput.py; dcp_async_slowdown_seconds
                              adds the wall-clock cost of the writer sharing the cores
  reshard_resume_equal        a checkpoint saved by 2 FSDP ranks, loaded by 1 unsharded process: every
                              tensor of the full model and optimizer state equal. Must be true
  load_peak_rss_ratio         peak RSS of a rank loading a pretrained ~135M-parameter Llama (safetensors)
                              into a 2-rank FSDP model the way the generator does under fsdp (meta
                              parameters, shard, read only its slices) over loading it whole on every
                              rank (from_pretrained) and then sharding. Goal <= 0.7;
                              load_peak_rss_growth_ratio: the same for the growth over the RSS before loading

``--host-memory`` (CPU, 2 gloo ranks, the ~135M-parameter Llama below under fsdp after one optimizer step): the
host-memory peak, over the RSS before it, of the two moments an FSDP stage adds host memory to a GPU pod
(training/rank_memory.py uses these figures for the submit-time host check). The peak is each rank's VmHWM,
reset (``/proc/self/clear_refs``) just before each moment. Keys:

  staging_bytes_per_parameter  one background DCP save (Checkpointer.save_dcp, async: the CPU staging copy
                               of this rank's parameter and AdamW shards, then the writer) per parameter of
                               the rank's shard; the larger of the two ranks
  gather_bytes_per_parameter   rank 0 at the end of the stage: full_model_state (the full fp32 model gathered
                               to its CPU) and save_pretrained of it, as training/generator.py does, per
                               parameter of the whole model

``--gpu`` (one command, all GPUs of the machine): for Llama shapes from 1B up, one bf16 training step on one
GPU with DDP's full replica, then FSDP over every GPU present (torchrun), until each runs out of memory;
prints the largest shape each strategy trains and its MFU (6 * params * tokens/s over 989 TFLOPS per GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.train_throughput import GEN_SHAPES, H100_BF16_PEAK_FLOPS  # noqa: E402
from training.components.stage import exit_process  # noqa: E402
from contract.paths import child_env  # noqa: E402

#: Shapes tried by ``--gpu``, smallest first (Llama-2/3-like proportions; vocab 32000).
GPU_SHAPES = {
    "1b": GEN_SHAPES["1b"],
    "3b": dict(vocab_size=32000, hidden_size=3072, num_hidden_layers=26, num_attention_heads=24,
               num_key_value_heads=8, intermediate_size=8192),
    "7b": dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=11008),
    "13b": dict(vocab_size=32000, hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=8, intermediate_size=13824),
}


# --------------------------------------------------------------------------- workers (under torchrun)


def _build(shape: dict, device: str, strategy: str, env, activation_checkpointing: bool = False):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from training.components import distributed as D
    from training.components import sharding as S
    from training.components.optim import build_optimizer
    from training.config.sections import OptimConfig, ParallelismConfig

    cfg = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(env.device)
    par = ParallelismConfig(strategy=strategy, activation_checkpointing=activation_checkpointing)
    model = S.shard_model(model, par, env, "generator")
    model.train()
    wrapped = D.wrap_ddp(model, env) if strategy == "ddp" else model
    return cfg, model, wrapped, build_optimizer(model, OptimConfig(lr=1e-4))


def _step(wrapped, model, opt, x, device: str, before_step=None) -> None:
    """One training step; ``before_step`` runs just before ``opt.step()`` (where the loop waits for a
    background checkpoint's CPU copy)."""
    import contextlib

    import torch

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    with autocast:
        loss = wrapped(input_ids=x, labels=x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if before_step is not None:
        before_step()
    opt.step()


def _timed(fn, env) -> float:
    import torch

    from training.components import distributed as D

    D.barrier(env)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    D.barrier(env)
    return time.perf_counter() - t0


def _raw_write(path: Path, tensors: list) -> None:
    """The tensors' bytes, written and fsynced with the same early writeback as checkpoint files (the kernel
    told to start writing each 16 MiB once written), so the ratio compares DCP's overhead, not writeback
    policies: a plain write-then-fsync of ~0.8 GB per rank runs into the dirty-page limits and loses to it."""
    import torch

    from training.components.checkpoint_dirs import _SYNC_FILE_RANGE_WRITE, _WRITEBACK_EVERY, _sync_file_range

    done = kicked = 0
    with path.open("wb", buffering=0) as fh:
        for t in tensors:
            done += fh.write(memoryview(t.contiguous().view(-1).view(dtype=torch.uint8).numpy()))
            if _sync_file_range is not None and done - kicked >= _WRITEBACK_EVERY:
                _sync_file_range(fh.fileno(), kicked, done - kicked, _SYNC_FILE_RANGE_WRITE)
                kicked = done
        os.fsync(fh.fileno())


def worker_measure(out: Path, steps: int, batch: int, seq: int, pairs: int, stall_repeats: int) -> None:
    """Both strategies in one job, their steps interleaved (ddp, fsdp, ddp, ...) so that the load of a
    shared machine hits both alike; then DCP saves interleaved with raw writes of the same bytes (a larger
    model, :func:`_save_vs_raw`), then the stall of a blocking and of a background DCP save."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from training.components import distributed as D
    from training.components import sharding as S
    from training.components.dcp import save_dcp_checkpoint

    env = D.init_distributed("cpu")
    built = {strategy: _build(GEN_SHAPES["cpu"], "cpu", strategy, env) for strategy in ("ddp", "fsdp")}
    torch.manual_seed(1 + env.rank)
    x = torch.randint(0, GEN_SHAPES["cpu"]["vocab_size"], (batch, seq))
    times: dict[str, list[float]] = {"ddp": [], "fsdp": []}
    result: dict = {"rank": env.rank}
    for i in range(steps + 1):
        for strategy, (_, model, wrapped, opt) in built.items():
            t = _timed(lambda: _step(wrapped, model, opt, x, "cpu"), env)
            if i == steps:
                result[strategy] = S.local_state_bytes(model, opt)  # gradients still held
            opt.zero_grad(set_to_none=True)
            if i:  # the first step of each is warm-up
                times[strategy].append(t)
    result["step_ratios"] = [f / d for f, d in zip(times["fsdp"], times["ddp"])]
    result["step_seconds"] = {k: statistics.median(v) for k, v in times.items()}
    del built["ddp"]
    _, model, _, opt = built["fsdp"]
    result.update(_save_vs_raw(out, env, pairs))
    # The blocking save of the stepped model: what a step stalls for without async_save, and the
    # checkpoint the 1-process reload compares with.
    blocking = [_timed(lambda: save_dcp_checkpoint(out / "ckpt", i + 1, model, opt, {}, env, 1), env)
                for i in range(stall_repeats)]
    result.update(blocking_seconds=statistics.median(blocking),
                  checkpoint=str(out / "ckpt" / f"step_{stall_repeats:06d}"))
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:  # the state the last checkpoint holds, before the stall measurement trains on
        torch.save({"model": msd, "optimizer": osd}, out / "full-2.pt")
    result.update(_dcp_stall(out / "async", built["fsdp"], x, env, result["step_seconds"]["fsdp"],
                             result["blocking_seconds"], stall_repeats))
    (out / f"measure-{env.rank}.json").write_text(json.dumps(result))
    D.destroy()


def _save_vs_raw(out: Path, env, pairs: int) -> dict:
    """DCP saves (save_dcp_checkpoint) interleaved with raw fsync'd writes of the same local bytes, of the
    FSDP-sharded ~135M-parameter Llama of the load measurement with its AdamW state (~0.8 GB per rank):
    a save that lasts seconds, so the bursts of a shared machine average out within each one."""
    import shutil

    import torch
    from torch.distributed.tensor import DTensor

    from training.components.dcp import save_dcp_checkpoint

    _, model, _, opt = _build(LOAD_SHAPE, "cpu", "fsdp", env)
    for p in model.parameters():  # materialise the AdamW state without a (slow) training step
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()] + \
            [v.to_local() if isinstance(v, DTensor) else v for s in opt.state.values() for v in s.values()
             if torch.is_tensor(v)]
    dcp_s, raw_s = [], []
    for i in range(pairs):
        ckroot = out / f"save-{i}"
        raw_path = out / f"raw-{env.rank}-{i}.bin"
        for what in ("dcp", "raw") if i % 2 == 0 else ("raw", "dcp"):  # neither always goes first
            if what == "dcp":
                dcp_s.append(_timed(lambda: save_dcp_checkpoint(ckroot, 1, model, opt, {}, env, 1), env))
            else:
                raw_s.append(_timed(lambda: _raw_write(raw_path, local), env))
                raw_path.unlink()
        if env.is_main:
            shutil.rmtree(ckroot)
    nbytes = sum(t.numel() * t.element_size() for t in local)
    return {"dcp_seconds": statistics.median(dcp_s), "raw_seconds": statistics.median(raw_s), "save_bytes": nbytes,
            "save_ratios": [r / d for r, d in zip(raw_s, dcp_s)]}


def _dcp_stall(root: Path, built, x, env, step_s: float, blocking_s: float, repeats: int) -> dict:
    """How long a background DCP save holds the training loop on this rank, as bench/train_throughput.py
    measures it for ``.pt`` saves: enough steps to cover the write, with and without the save in flight."""
    from training.components.checkpoint import Checkpointer

    _, model, wrapped, opt = built
    n = max(3, math.ceil(blocking_s / step_s) + 2)
    held: list[float] = []
    slowdown: list[float] = []

    def blocked(fn) -> None:
        t0 = time.perf_counter()
        fn()
        held[-1] += time.perf_counter() - t0

    def steps(ck=None) -> None:
        for _ in range(n):
            _step(wrapped, model, opt, x, "cpu", before_step=(lambda: blocked(ck.wait_snapshot)) if ck else None)
            opt.zero_grad(set_to_none=True)

    ck = Checkpointer(root, 1, env.is_main)
    for i in range(repeats):
        held.append(0.0)
        base = _timed(steps, env)

        def save_and_steps(step: int = i + 1) -> None:
            blocked(lambda: ck.save_dcp(step, model, opt, {}, env, blocking=False))
            steps(ck)
            blocked(ck.wait)

        slowdown.append(_timed(save_and_steps, env) - base)
    return {"stall_seconds": statistics.median(held), "stall_steps": n,
            "async_slowdown_seconds": statistics.median(slowdown)}


def worker_reload(checkpoint: Path, out: Path) -> None:
    """One unsharded process loads the 2-rank DCP checkpoint and dumps its full state."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from training.components import distributed as D
    from training.components.dcp import load_dcp_state

    env = D.init_distributed("cpu")
    _, model, _, opt = _build(GEN_SHAPES["cpu"], "cpu", "fsdp", env)
    load_dcp_state(checkpoint, model, opt)
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    torch.save({"model": msd, "optimizer": osd}, out / "full-1.pt")


#: The model whose loading is measured: ~135M parameters (540 MB fp32), big enough to stand out of
#: the interpreter's own few hundred MB.
LOAD_SHAPE = dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=16, intermediate_size=2816)


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker_load(how: str, source: Path, out: Path) -> None:
    """Load the pretrained Llama at ``source`` into a 2-rank FSDP model: ``full`` = from_pretrained on every
    rank, then shard (what a DDP-style load does); ``meta`` = meta parameters, shard, read own slices."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.components import distributed as D
    from training.components import sharding as S
    from training.config.sections import ParallelismConfig

    env = D.init_distributed("cpu")
    before = _peak_rss_bytes()
    par = ParallelismConfig(strategy="fsdp")
    if how == "full":
        model = S.shard_model(AutoModelForCausalLM.from_pretrained(source), par, env, "generator")
    else:
        with S.params_on_meta():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
        model = S.shard_model(model, par, env, "generator")
        S.load_safetensors_sharded(model, env.device, source)
    D.barrier(env)
    (out / f"load-{how}-{env.rank}.json").write_text(json.dumps({"before": before, "peak": _peak_rss_bytes()}))
    D.destroy()


def _rss_bytes(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last :func:`_reset_peak`) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise SystemExit(f"/proc/self/status has no {field}")


def _reset_peak() -> int:
    """Reset the peak RSS to the current RSS (Linux: ``5`` to ``/proc/self/clear_refs``); returns the RSS."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return _rss_bytes("VmRSS")


def worker_host(out: Path, batch: int, seq: int) -> None:
    """The host-memory peak of a background DCP save of a stepped FSDP model, then of the rank-0 gather and
    save_pretrained that end a generator stage (see ``--host-memory``)."""
    import torch

    from training.components import distributed as D
    from training.components import sharding as S
    from training.components.checkpoint import Checkpointer

    env = D.init_distributed("cpu")
    _, model, wrapped, opt = _build(LOAD_SHAPE, "cpu", "fsdp", env)
    torch.manual_seed(1 + env.rank)
    x = torch.randint(0, LOAD_SHAPE["vocab_size"], (batch, seq))
    _step(wrapped, model, opt, x, "cpu")
    opt.zero_grad(set_to_none=True)
    local = S.local_state_bytes(model, opt)["params"] // 4  # fp32: elements of this rank's shard
    total = sum(p.numel() for p in model.parameters())
    D.barrier(env)
    ck = Checkpointer(out / "host-ckpt", 1, env.is_main)
    base = _reset_peak()
    ck.save_dcp(1, model, opt, {}, env, blocking=False)
    ck.wait_snapshot()
    ck.wait()
    staging = _rss_bytes("VmHWM") - base
    D.barrier(env)
    base = _reset_peak()
    full = S.full_model_state(model)
    if env.is_main:  # what training/generator.py does with it
        from transformers import AutoModelForCausalLM, LlamaConfig

        with S.params_on_meta():
            hf = AutoModelForCausalLM.from_config(LlamaConfig(**LOAD_SHAPE, tie_word_embeddings=True))
        tied = {n for n, _ in hf.named_parameters(remove_duplicate=False)} - {n for n, _ in hf.named_parameters()}
        hf.save_pretrained(out / "host-model", state_dict={k: v for k, v in full.items() if k not in tied})
    del full
    gather = _rss_bytes("VmHWM") - base
    D.barrier(env)
    (out / f"host-{env.rank}.json").write_text(json.dumps({
        "rank": env.rank, "local_parameters": local, "parameters": total,
        "staging_bytes": staging, "gather_bytes": gather}))
    D.destroy()


def host_figures(work: Path, batch: int, seq: int) -> dict:
    _torchrun(2, ["--worker", "host", "--out", str(work), "--batch", str(batch), "--seq", str(seq)], timeout=1200)
    ranks = [_read(work / f"host-{r}.json") for r in (0, 1)]
    return {
        "staging_bytes_per_parameter": max(r["staging_bytes"] / r["local_parameters"] for r in ranks),
        "gather_bytes_per_parameter": ranks[0]["gather_bytes"] / ranks[0]["parameters"],
        "parameters": ranks[0]["parameters"], "ranks": ranks,
    }


def worker_gpu(shape: str, strategy: str, out: Path, batch: int, seq: int) -> None:
    import torch

    from training.components import distributed as D

    env = D.init_distributed("cuda")
    result: dict = {"shape": shape, "strategy": strategy, "world_size": env.world_size}
    try:
        cfg, model, wrapped, opt = _build(GPU_SHAPES[shape], "cuda", strategy, env, activation_checkpointing=True)
        n_params = sum(p.numel() for p in model.parameters()) * (env.world_size if strategy == "fsdp" else 1)
        x = torch.randint(0, cfg.vocab_size, (batch, seq), device=env.device)
        times = []
        for _ in range(3):
            times.append(_timed(lambda: _step(wrapped, model, opt, x, "cuda"), env))
            opt.zero_grad(set_to_none=True)
        step = statistics.median(times[1:])
        tokens_per_s = batch * seq * env.world_size / step
        result.update(ok=True, params=n_params, step_seconds=step,
                      mfu=6 * n_params * tokens_per_s / (H100_BF16_PEAK_FLOPS * env.world_size),
                      peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    except torch.OutOfMemoryError:
        result.update(ok=False, error="out of memory")
    if env.is_main:
        (out / f"gpu-{shape}-{strategy}.json").write_text(json.dumps(result))
    D.destroy()


# --------------------------------------------------------------------------- driver


def _torchrun(nproc: int, args: list[str], timeout: int) -> None:
    env = child_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           __file__, *args]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise SystemExit(f"waited {timeout}s for {' '.join(args[:2])} x{nproc}; it did not finish: "
                         f"{(err.stderr or b'')[-2000:]!r}") from None
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} x{nproc} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _same_state(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a, weights_only=False), torch.load(b, weights_only=False)

    def eq(u, v) -> bool:
        if isinstance(u, dict):
            return isinstance(v, dict) and u.keys() == v.keys() and all(eq(u[k], v[k]) for k in u)
        if isinstance(u, (list, tuple)):
            return len(u) == len(v) and all(eq(i, j) for i, j in zip(u, v))
        return torch.equal(u, v) if torch.is_tensor(u) else u == v

    return eq(x, y)


def cpu_figures(work: Path, quick: bool, batch: int, seq: int) -> dict:
    steps, pairs, stall_repeats = (2, 3, 1) if quick else (5, 7, 3)
    _torchrun(2, ["--worker", "measure", "--out", str(work), "--steps", str(steps), "--pairs", str(pairs),
                  "--stall-repeats", str(stall_repeats),
                  "--batch", str(batch), "--seq", str(seq)], timeout=1200)
    ranks = [_read(work / f"measure-{r}.json") for r in (0, 1)]
    m = ranks[0]
    _torchrun(1, ["--worker", "reload", "--checkpoint", m["checkpoint"], "--out", str(work)], timeout=600)

    def total(r: dict) -> int:
        return r["params"] + r["grads"] + r["optimizer"]

    from transformers import AutoModelForCausalLM, LlamaConfig

    source = work / "pretrained"
    AutoModelForCausalLM.from_config(LlamaConfig(**LOAD_SHAPE, tie_word_embeddings=True)).save_pretrained(source)
    for how in ("full", "meta"):
        _torchrun(2, ["--worker", "load", "--how", how, "--checkpoint", str(source), "--out", str(work)], timeout=600)
    load = {how: [_read(work / f"load-{how}-{r}.json") for r in (0, 1)] for how in ("full", "meta")}
    peak = {how: max(r["peak"] for r in load[how]) for how in load}
    growth = {how: max(r["peak"] - r["before"] for r in load[how]) for how in load}

    return {
        "state_bytes_per_rank_ratio": total(m["fsdp"]) / total(m["ddp"]),
        "fsdp_vs_ddp_step_time": statistics.median(x for r in ranks for x in r["step_ratios"]),
        "dcp_save_vs_raw": statistics.median(m["save_ratios"]),
        "dcp_stall_ratio": max(r["stall_seconds"] for r in ranks) / m["blocking_seconds"],
        "reshard_resume_equal": _same_state(work / "full-2.pt", work / "full-1.pt"),
        "load_peak_rss_ratio": peak["meta"] / peak["full"],
        "load_peak_rss_growth_ratio": growth["meta"] / growth["full"],
        "load_peak_rss_bytes": peak, "state_bytes_ddp": total(m["ddp"]), "state_bytes_fsdp": total(m["fsdp"]),
        "step_seconds_ddp": m["step_seconds"]["ddp"], "step_seconds_fsdp": m["step_seconds"]["fsdp"],
        "batch_per_rank": batch, "seq": seq, "dcp_seconds": m["dcp_seconds"], "raw_seconds": m["raw_seconds"],
        "save_bytes_per_rank": m["save_bytes"], "dcp_save_vs_raw_ratios": m["save_ratios"],
        "dcp_stall_seconds_blocking": m["blocking_seconds"],
        "dcp_stall_seconds_async": max(r["stall_seconds"] for r in ranks),
        "dcp_async_slowdown_seconds": max(r["async_slowdown_seconds"] for r in ranks),
        "dcp_stall_steps": m["stall_steps"],
        "goals": {"state_bytes_per_rank_ratio": "<= 0.55", "fsdp_vs_ddp_step_time": "<= 1.25",
                  "dcp_save_vs_raw": ">= 0.8", "dcp_stall_ratio": "<= 0.10", "reshard_resume_equal": "true",
                  "load_peak_rss_ratio": "<= 0.7"},
    }


def gpu_figures(work: Path, batch: int, seq: int) -> dict:
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise SystemExit("--gpu: no CUDA device on this machine")
    out: dict = {"gpus": n, "batch": batch, "seq": seq}
    for strategy, nproc in (("ddp", 1), ("fsdp", n)):
        best = None
        for shape in GPU_SHAPES:
            _torchrun(nproc, ["--worker", "gpu", "--shape", shape, "--strategy", strategy, "--out", str(work),
                              "--batch", str(batch), "--seq", str(seq)], timeout=1200)
            r = _read(work / f"gpu-{shape}-{strategy}.json")
            print(json.dumps(r), file=sys.stderr)
            if not r["ok"]:
                break
            best = r
        out[f"largest_{strategy}"] = best and {k: best[k] for k in ("shape", "params", "mfu", "step_seconds",
                                                                   "peak_gib", "world_size")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--gpu", action="store_true", help="largest generator per strategy on this machine's GPUs")
    ap.add_argument("--host-memory", action="store_true",
                    help="host-memory peak per parameter of an async DCP save and the rank-0 gather (CPU)")
    ap.add_argument("--worker", choices=("measure", "reload", "load", "gpu", "host"), help=argparse.SUPPRESS)
    ap.add_argument("--how", choices=("full", "meta"), default="meta", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="1b", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", default="", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--pairs", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--stall-repeats", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=None, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence")
    args = ap.parse_args()
    if args.worker == "measure":
        worker_measure(Path(args.out), args.steps, args.batch, args.seq, args.pairs, args.stall_repeats)
        return 0
    if args.worker == "reload":
        worker_reload(Path(args.checkpoint), Path(args.out))
        return 0
    if args.worker == "load":
        worker_load(args.how, Path(args.checkpoint), Path(args.out))
        return 0
    if args.worker == "host":
        worker_host(Path(args.out), args.batch or 2, args.seq or 64)
        return 0
    if args.worker == "gpu":
        worker_gpu(args.shape, args.strategy, Path(args.out), args.batch or 4, args.seq or 2048)
        return 0
    with tempfile.TemporaryDirectory(prefix="ragpool-fsdp-bench-", dir=args.dir) as tmp:
        work = Path(tmp)
        if args.host_memory:
            figures = host_figures(work, args.batch or 2, args.seq or 64)
        else:
            figures = gpu_figures(work, args.batch or 4, args.seq or 2048) if args.gpu else \
                cpu_figures(work, args.quick, args.batch or 4, args.seq or 256)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    # A rank (--worker) ends like a stage process, without interpreter finalization: Gloo's threads outlive an
    # FSDP2 step and can abort a rank whose work is done (training/components/stage.py: exit_process).
    exit_process(main())
