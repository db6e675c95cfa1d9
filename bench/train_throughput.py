"""Training throughput figures on this machine; the last line printed is one JSON object.

    python bench/train_throughput.py [--dir /tmp/ragpool-bench] [--quick]
    python bench/train_throughput.py --gpu-generator     # on a CUDA machine: ~1B Llama, bf16

--gpu-generator prints one JSON object whose ``mfu`` is 6 * params * tokens/s of the ~1B-parameter
generator step (bf16 autocast, fused AdamW, batch 8 x 2048 tokens) over 989 TFLOPS.

Keys (ratios as fractions):
  mfu                      generator training step: 6 * params * tokens/s over the fp32 matmul
                           peak measured in the same run (torch.mm, all threads)
  retriever_samples_per_s  all-MiniLM-L6-v2 contrastive step, questions/s, one process, all threads
  ddp_scaling              1-process step time over 2-process DDP step time at the same per-process
                           batch (= per-process throughput ratio): one torchrun job, one thread per
                           process, gloo, the training loop's DDP wrapper with its defaults
                           (fp32, row-sparse embedding all-reduce) and cross-rank negatives;
                           every batch is trained alone, by two independent processes, with DDP and
                           with DDP + bf16 gradients back to back, and the median of the per-batch
                           ratios is reported; ddp_scaling_bf16_grads: the same with
                           distributed.grad_compression=bf16; ddp_host_ceiling: two un-wrapped
                           processes at once over one alone (what sharing the host costs);
                           ddp_comm_efficiency: those two over DDP (what synchronising costs)
  ckpt_vs_raw              synchronous checkpoint MB/s over raw write+fsync MB/s of the same bytes
                           (medians of interleaved pairs; ckpt_vs_raw_best_of_each: best of each)
  ckpt_stall_ratio         time the training loop is blocked by one periodic background checkpoint
                           (hand-off + waiting for the CPU copy before the next optimizer step + any
                           wait for the writer at the next save) over the synchronous
                           save time of the same state; ckpt_async_slowdown_seconds adds the wall-clock
                           cost of the writer thread sharing the cores
Other keys give the underlying measurements. Targets on a 2-core CPU: mfu >= 0.60,
ddp_scaling >= 0.95, ckpt_vs_raw >= 0.90, ckpt_stall_ratio <= 0.10.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def matmul_peak_flops(n: int = 2048, reps: int = 5) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


# Generator shapes: "tiny" for the smoke test, "cpu" for the 2-core CPU figure, "1b" the
# ~1B-parameter Llama (Llama-3.2-1B's width and depth, a 32k vocabulary) for the GPU figure.
GEN_SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=128),
    "cpu": dict(vocab_size=1024, hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                num_key_value_heads=12, intermediate_size=2048),
    "1b": dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192),
}
# Dense BF16 tensor-core peak of an H100/H200 SXM (NVIDIA's datasheet figure without sparsity).
H100_BF16_PEAK_FLOPS = 989e12


def generator_step(quick: bool, shape: str = "cpu", device: str = "cpu", batch: int = 4, seq: int = 256,
                   bf16: bool = False) -> dict:
    """Full causal-LM training steps (all-token loss, so 6*N*T counts the work done).

    The training loop's optimizer (fused AdamW) and, with ``bf16``, its autocast.
    """
    import contextlib

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, LlamaConfig

    from training.config.sections import OptimConfig
    from training.components.optim import build_optimizer

    cfg = LlamaConfig(**GEN_SHAPES[shape], max_position_embeddings=max(512, seq), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(device)
    model.train()
    opt = build_optimizer(model, OptimConfig(lr=1e-4))
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    n_params = sum(p.numel() for p in model.parameters())
    autocast = torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    steps, warm = (2, 1) if quick else (5, 2)
    times = []
    for i in range(warm + steps):
        sync()
        t0 = time.perf_counter()
        with autocast:
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= warm:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tokens_per_s = batch * seq / step_s
    out = {"gen_params": n_params, "gen_tokens_per_s": tokens_per_s, "gen_flops": 6 * n_params * tokens_per_s,
           "gen_shape": shape, "gen_batch": batch, "gen_seq": seq, "gen_dtype": "bf16" if bf16 else "fp32",
           "gen_loss": float(loss.detach())}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        out["gpu_peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def gpu_generator(shape: str, batch: int, seq: int, quick: bool, device: str = "cuda") -> dict:
    """The GPU figure: generator step in bf16 autocast, MFU against 989 TFLOPS (dense BF16)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--gpu-generator needs a CUDA device (use --gen-device cpu only to smoke-test the path)")
    gen = generator_step(quick, shape, device, batch, seq, bf16=True)
    return {"mfu": gen["gen_flops"] / H100_BF16_PEAK_FLOPS, "peak_flops": H100_BF16_PEAK_FLOPS,
            "device": device, **gen}


def _retriever_setup(per_rank_batch: int, env):
    """Real MiniLM, real synthetic data, the retriever stage's own batch and loss code."""
    from training.demo import synthetic
    from training.config.run import load_run_config
    from training.components.corpus import MemoryCorpus
    from training.components.data import Passage, QAExample, Datasets
    from training.components.models import load_encoder
    from training.components.optim import build_optimizer
    from training.retriever import make_task

    data = synthetic.generate(0, 60)
    ds = Datasets([Passage(p["id"], p["text"]) for p in data["corpus"]],
                  [QAExample(q["question"], q["answer"], tuple(q["positive_ids"]), tuple(q["hard_negative_ids"]))
                   for q in data["qa_train"]], [])
    cfg = load_run_config({"retriever": {"max_length": 48, "global_batch_size": per_rank_batch * env.world_size}})
    model, tok = load_encoder("")
    task = make_task(cfg, env, MemoryCorpus(ds.corpus), ds.train, model, tok)
    return cfg, ds, model, task, build_optimizer(model, cfg.retriever.optim)


def _timed_steps(model, task, opt, env, batches: list[list[int]], warm: int) -> list[float]:
    """Step times of the retriever's own contrastive step over ``batches`` (barrier-fenced when distributed)."""
    return [_timed_step(model, task, opt, env, idx) for idx in batches[:1] * warm + batches][warm:]


def _timed_step(model, task, opt, env, idx: list[int]) -> float:
    """One optimizer step of the retriever's contrastive loss, from a barrier to a barrier."""
    from training.components import distributed as D

    batch = task.make_batch(idx)
    D.barrier(env)
    t0 = time.perf_counter()
    loss = task.loss_sum(model, batch, env.device) / len(idx)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    D.barrier(env)
    return time.perf_counter() - t0


def ddp_worker(per_rank_batch: int, steps: int, warm: int) -> dict:
    """One rank of the scaling benchmark, launched by torchrun with 2 processes.

    Every batch is trained four ways back to back, each by its own copy of the model:
    rank 0 alone (rank 1 waits in a barrier), both ranks un-wrapped at once, DDP (the
    training loop's wrapper, cross-rank negatives) and DDP with bf16 gradients. The ratios
    are taken per batch and their medians reported: on a shared virtual host the speed of a
    core drifts by 10 % and more over tens of seconds, so comparing phases that run minutes apart
    (or different batches: step cost follows the padded lengths) measures the drift.
    The order of the four alternates between batches so none always runs first.
    """
    import torch

    from training.components import distributed as D
    from training.components.distributed import DistEnv

    env = D.init_distributed("cpu")
    torch.set_num_threads(1)  # one core per process in every variant
    solo_env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    _, _, s_model, s_task, s_opt = _retriever_setup(per_rank_batch, solo_env)
    _, _, model, task, opt = _retriever_setup(per_rank_batch, env)
    wrapped = D.wrap_ddp(model, env)
    _, _, c_model, c_task, c_opt = _retriever_setup(per_rank_batch, env)
    compressed = D.wrap_ddp(c_model, env, grad_compression="bf16")
    for m in (model, s_model, c_model):
        m.train()

    def solo(idx: list[int]) -> float:
        if env.rank == 0:
            t = _timed_step(s_model, s_task, s_opt, solo_env, idx)
        D.barrier(env)  # rank 1 waits here, off the core rank 0 runs on
        return t if env.rank == 0 else float("nan")

    def independent(idx: list[int]) -> float:
        D.barrier(env)  # start together
        t = _timed_step(s_model, s_task, s_opt, solo_env, idx)
        D.barrier(env)
        return t

    variants = {
        "solo": solo,
        "indep": independent,
        "ddp": lambda idx: _timed_step(wrapped, task, opt, env, idx),
        "ddp_bf16": lambda idx: _timed_step(compressed, c_task, c_opt, env, idx),
    }
    batches = [[(s * per_rank_batch + i) % task.n_examples for i in range(per_rank_batch)] for s in range(steps)]
    for name, step in variants.items():  # first steps allocate and fault in memory
        for _ in range(warm):
            step(batches[0])
    times: dict[str, list[float]] = {name: [] for name in variants}
    for s, idx in enumerate(batches):
        for name in list(variants)[:: 1 if s % 2 == 0 else -1]:
            times[name].append(variants[name](idx))
    D.destroy()
    state = getattr(wrapped, "sparse_embedding_grads", None)
    return {"rank": env.rank, "world": env.world_size, "threads": torch.get_num_threads(), "times": times,
            "embedding_rows_sent": state.rows_sent / state.rows_total if state is not None else 1.0}


def run_ddp_scaling(per_rank_batch: int, steps: int, warm: int) -> dict:
    import statistics

    from contract.paths import child_env
    from training.scheduler.worker.child import torchrun_argv

    env = child_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = torchrun_argv([str(Path(__file__).resolve()), "--worker", "--per-rank-batch", str(per_rank_batch),
                         "--steps", str(steps), "--warm", str(warm)], nproc=2)
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"torchrun worker failed:\n{out.stderr[-3000:]}")
    ranks = {r["rank"]: r for r in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}
    results = {rank: r["times"] for rank, r in ranks.items()}
    print(json.dumps({"ddp_step_seconds_by_rank": results}), file=sys.stderr)  # for whoever reads the log
    solo = results[0]["solo"]
    # A step both ranks take ends when the slower one does.
    both = {k: [max(a, b) for a, b in zip(results[0][k], results[1][k])] for k in ("indep", "ddp", "ddp_bf16")}

    def ratio(num: list[float], den: list[float]) -> float:  # median of per-batch ratios
        return statistics.median(n / d for n, d in zip(num, den))

    scaling = [n / d for n, d in zip(solo, both["ddp"])]
    ddp_s = statistics.median(both["ddp"])
    return {"ddp_1proc_samples_per_s": per_rank_batch / statistics.median(solo),
            "ddp_2proc_samples_per_s_per_process": per_rank_batch / ddp_s,
            "ddp_scaling": statistics.median(scaling), "ddp_per_rank_batch": per_rank_batch,
            # Two un-wrapped processes at once over one alone: the host's own ceiling for
            # ddp_scaling; ddp_comm_efficiency is what DDP keeps of it.
            "ddp_host_ceiling": ratio(solo, both["indep"]),
            "ddp_comm_efficiency": ratio(both["indep"], both["ddp"]),
            # The same with distributed.grad_compression=bf16 (half the all-reduce bytes).
            "ddp_scaling_bf16_grads": ratio(solo, both["ddp_bf16"]),
            # How far the median of these few noisy ratios can be trusted (bootstrap).
            "ddp_scaling_ci90": median_ci90(scaling), "ddp_steps": steps,
            # distributed.sparse_embedding_grads (auto: on with gloo): the share of the word
            # embedding table's rows that went through the all-reduce.
            "ddp_embedding_rows_sent": ranks[0]["embedding_rows_sent"]}


def median_ci90(values: list[float], resamples: int = 2000) -> list[float]:
    """90 % bootstrap confidence interval of the median of ``values`` (seeded: same input, same answer)."""
    import random
    import statistics

    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [round(medians[int(0.05 * resamples)], 4), round(medians[int(0.95 * resamples) - 1], 4)]


def retriever_single(quick: bool) -> float:
    import statistics

    import torch

    from training.components.distributed import DistEnv

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    torch.set_num_threads(os.cpu_count() or 1)
    _, _, model, task, opt = _retriever_setup(16, env)
    model.train()
    steps, warm = (2, 1) if quick else (6, 2)
    batches = [[(s * 16 + i) % task.n_examples for i in range(16)] for s in range(steps)]
    return 16 / statistics.median(_timed_steps(model, task, opt, env, batches, warm))


def checkpoint_figures(workdir: Path, quick: bool) -> dict:
    """Sync checkpoint vs raw fsync bandwidth, and the stall one background checkpoint causes."""
    import torch

    from training.components.checkpoint import Checkpointer
    from training.components.checkpoint_dirs import write_checkpoint_dir
    from training.config.sections import OptimConfig
    from training.components.models import load_encoder
    from training.components.optim import build_optimizer

    model, tok = load_encoder("")
    opt = build_optimizer(model, OptimConfig())
    for p in model.parameters():  # materialise Adam state so the checkpoint has its real size
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    # Raw: the same number of bytes, one file, write + fsync.
    t0 = time.perf_counter()
    write_checkpoint_dir(workdir / "warm", 0, state)
    nbytes = sum(f.stat().st_size for f in (workdir / "warm" / "step_000000").iterdir())
    shutil.rmtree(workdir / "warm")
    buf = os.urandom(1 << 20) * (nbytes >> 20)
    raw_s, sync_s = [], []
    # Interleaved pairs and medians: one write + fsync on a shared virtual disk varies by
    # +-40 % from call to call, so a single pair (or the best of each) mostly measures luck.
    for i in range(2 if quick else 7):
        t0 = time.perf_counter()
        with open(workdir / f"raw{i}.bin", "wb") as fh:
            fh.write(buf)
            fh.flush()
            os.fsync(fh.fileno())
        raw_s.append(time.perf_counter() - t0)
        os.remove(workdir / f"raw{i}.bin")
        t0 = time.perf_counter()
        write_checkpoint_dir(workdir / "sync", i, state)
        sync_s.append(time.perf_counter() - t0)
        shutil.rmtree(workdir / "sync")
    import statistics

    raw_mbps = len(buf) / 2**20 / statistics.median(raw_s)
    sync_save = statistics.median(sync_s)
    sync_mbps = nbytes / 2**20 / sync_save
    best_ratio = (nbytes / min(sync_s)) / (len(buf) / min(raw_s))

    # Stall: the same training steps with and without one background checkpoint in flight.
    from training.components.distributed import DistEnv

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    _, ds, model, task, opt = _retriever_setup(16, env)
    model.train()
    batches = [task.make_batch([(s * 16 + i) % len(ds.train) for i in range(16)]) for s in range(4)]

    blocked = [0.0]

    def steps(n: int, ck: Checkpointer | None = None) -> float:
        t0 = time.perf_counter()
        for s in range(n):
            (task.loss_sum(model, batches[s % 4], env.device) / 16).backward()
            if ck is not None:  # as training.components.loop does: the weights may change once copied
                t1 = time.perf_counter()
                ck.wait_snapshot()
                blocked[0] += time.perf_counter() - t1
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    steps(1)
    step_s = min(steps(1) for _ in range(2))
    n = max(3, int(round(sync_save / step_s)) + 2)  # enough steps to cover the background write
    base = min(steps(n) for _ in range(1 if quick else 2))
    ck = Checkpointer(workdir / "async", keep_latest_k=1, is_main=True)
    t0 = time.perf_counter()
    # What the training loop blocks on: handing the state to the writer thread, waiting for its
    # CPU copy before the next optimizer step, and any wait for the writer at the next save.
    ck.save(1, {"model": model.state_dict(), "optimizer": opt.state_dict()}, blocking=False)
    blocked[0] += time.perf_counter() - t0
    steps(n, ck)
    t1 = time.perf_counter()
    ck.wait()
    blocked[0] += time.perf_counter() - t1
    with_ckpt = time.perf_counter() - t0
    return {"ckpt_bytes": nbytes, "ckpt_sync_mb_per_s": sync_mbps, "raw_fsync_mb_per_s": raw_mbps,
            "ckpt_sync_seconds": sync_save, "ckpt_stall_seconds": blocked[0],
            # Wall-clock cost of the writer thread sharing the cores with training (noisy on a busy host).
            "ckpt_async_slowdown_seconds": with_ckpt - base, "ckpt_stall_steps": n,
            "ckpt_vs_raw": sync_mbps / raw_mbps, "ckpt_vs_raw_best_of_each": best_ratio, "ckpt_stall_ratio": blocked[0] / sync_save}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="scratch directory for checkpoint I/O (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--gpu-generator", action="store_true",
                    help="only the generator step on CUDA in bf16, MFU against 989 TFLOPS (needs a GPU)")
    ap.add_argument("--gen-shape", choices=sorted(GEN_SHAPES), default="1b", help="model for --gpu-generator")
    ap.add_argument("--gen-batch", type=int, default=8, help="sequences per step for --gpu-generator")
    ap.add_argument("--gen-seq", type=int, default=2048, help="tokens per sequence for --gpu-generator")
    ap.add_argument("--gen-device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu only smoke-tests --gpu-generator (its mfu is then meaningless)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--per-rank-batch", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--warm", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(ddp_worker(args.per_rank_batch, args.steps, args.warm)), flush=True)
        return 0

    if args.gpu_generator:
        print(json.dumps(gpu_generator(args.gen_shape, args.gen_batch, args.gen_seq, args.quick,
                                       args.gen_device)))
        return 0

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    figures: dict = {"cpus": os.cpu_count(), "torch": torch.__version__}
    peak = matmul_peak_flops()
    gen = generator_step(args.quick)
    figures.update({"fp32_matmul_peak_gflops": peak / 1e9, **gen, "mfu": gen["gen_flops"] / peak})
    print(f"generator: {gen['gen_tokens_per_s']:.0f} tok/s, MFU {gen['gen_flops'] / peak:.3f}", file=sys.stderr)
    figures["retriever_samples_per_s"] = retriever_single(args.quick)
    print(f"retriever: {figures['retriever_samples_per_s']:.1f} q/s", file=sys.stderr)
    steps, warm = (2, 1) if args.quick else (12, 1)
    figures.update(run_ddp_scaling(16, steps, warm))
    print(f"ddp scaling {figures['ddp_scaling']:.3f}", file=sys.stderr)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ragpool-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures.update(checkpoint_figures(work, args.quick))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    keys = ["mfu", "retriever_samples_per_s", "ddp_scaling", "ckpt_vs_raw", "ckpt_stall_ratio"]
    ordered = {k: round(figures[k], 4) for k in keys}
    ordered.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items() if k not in keys})
    print(json.dumps(ordered))
    return 0


if __name__ == "__main__":
    # A rank (--worker) ends like a stage process, without interpreter finalization (Gloo's threads outlive
    # the process group: training/components/stage.py, exit_process).
    from training.components.stage import exit_process

    exit_process(main())
