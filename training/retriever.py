"""Fine-tune a dual encoder with an in-batch-negatives contrastive loss.

    torchrun --nnodes=N --nproc-per-node=G -m training.retriever --config RUN.yaml [--key=value ...]
    python -m training.retriever --config RUN.yaml          # one process

Each question's positive passage (plus ``retriever.hard_negatives`` hard negatives) is
scored against every passage of the global micro-batch: passage embeddings are gathered
from all ranks with a gradient-preserving all-gather, logits are cosine / temperature.
Output: ``<shared>/runs/<run_id>/retriever/model/`` (Hugging Face format) and ``_COMPLETE``.
Exit codes: :mod:`contract.exit_codes` (75 = preempted, rerun to resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training.components import distributed as D
from training.components.data import Datasets, load_datasets
from training.components.logs import get_logger
from training.components.loop import TrainTask, seed_everything, train
from training.components.models import DualEncoder, load_encoder, save_encoder
from training.components.stage import complete_stage, exit_process, run_main, run_stage
from training.config import RunConfig
from contract.exit_codes import OK

STAGE = "retriever"


def make_task(cfg: RunConfig, env: D.DistEnv, data: Datasets, model: DualEncoder, tokenizer: Any) -> TrainTask:
    rc = cfg.retriever
    text_of = {p.id: p.text for p in data.corpus}
    corpus_ids = [p.id for p in data.corpus]
    h = rc.hard_negatives
    max_len = rc.max_length

    def negatives_for(i: int) -> list[str]:
        ex = data.train[i]
        negs = [n for n in ex.hard_negative_ids if n not in ex.positive_ids][:h]
        j = 0
        while len(negs) < h:  # deterministic filler keeps shapes equal across ranks
            cand = corpus_ids[(i * 7919 + j) % len(corpus_ids)]
            if cand not in ex.positive_ids and cand not in negs:
                negs.append(cand)
            j += 1
        return negs

    def make_batch(indices: list[int]) -> dict[str, Any]:
        qs = [data.train[i].question for i in indices]
        pos = [text_of[data.train[i].positive_ids[0]] for i in indices]
        negs = [text_of[n] for i in indices for n in negatives_for(i)]
        enc = tokenizer(qs + pos + negs, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "n": len(indices)}

    def loss_sum(wrapped: torch.nn.Module, batch: dict[str, Any], device: torch.device) -> torch.Tensor:
        emb = wrapped(batch["input_ids"].to(device), batch["attention_mask"].to(device)).float()
        b = batch["n"]
        q, p = emb[:b], emb[b:]
        offset = 0
        if rc.gather_negatives and env.distributed:
            offset = env.rank * p.shape[0]
            p = D.all_gather_with_grad(env, p)
        logits = q @ p.T / rc.temperature
        labels = torch.arange(b, device=device) + offset
        return F.cross_entropy(logits, labels, reduction="sum")

    return TrainTask(
        stage=STAGE, model=model, n_examples=len(data.train), global_batch_size=rc.global_batch_size,
        grad_accum=rc.grad_accum, max_steps=rc.max_steps, optim=rc.optim, make_batch=make_batch,
        count=lambda b: int(b["n"]), loss_sum=loss_sum, tokens=lambda b: int(b["attention_mask"].sum()),
        parallelism=rc.parallelism)


def _train(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    out: Path = cfg.stage_dir(STAGE)
    data = load_datasets(cfg.shared_root, cfg.data.corpus, cfg.data.qa_train, cfg.data.qa_eval)
    seed_everything(cfg.seed)
    model, tokenizer = load_encoder(cfg.retriever.model)
    log.info("retriever: %d train questions, %d passages, world_size=%d, device=%s",
             len(data.train), len(data.corpus), env.world_size, env.device)
    result = train(make_task(cfg, env, data, model, tokenizer), cfg, env, out)
    if result.exit_code != OK:
        return result.exit_code
    if env.is_main:
        save_encoder(model, tokenizer, out / "model")
        log.info("retriever model saved to %s", out / "model")
        complete_stage(cfg, STAGE, {**result.summary(), "model": str(out / "model")})
    return OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    return run_stage(cfg, env, STAGE, _train)


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
