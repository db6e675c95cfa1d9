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

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from training.components import distributed as D
from training.components.corpus import Corpus, MemoryCorpus
from training.components.data import QAExample
from training.components.logs import get_logger
from training.components.loop import TrainTask, seed_everything, train
from training.components.models import DualEncoder, load_encoder, save_encoder
from training.components.run_data import load_run_data
from training.components.search import auxiliary_index, topk
from training.components.stage import complete_stage, exit_process, run_main, run_stage
from training.config.run import RunConfig
from contract.exit_codes import OK

STAGE = "retriever"
MINING_DIR = "mining_index"


def mine_negatives(cfg: RunConfig, env: D.DistEnv, corpus: Corpus, train_set: list[QAExample]) -> np.ndarray:
    """``retriever.mining``: the base encoder's index of the corpus (the index stage's sharded path, in
    ``retriever/mining_index/``) searched once for every training question (sharded across ranks, stored);
    per question the corpus rows ranked ``[rank_from, rank_to)``, positives and padding dropped, the first
    ``count`` kept (``-1`` pads). The same on every rank."""
    m = cfg.retriever.mining
    out = cfg.stage_dir(STAGE) / MINING_DIR
    marker = auxiliary_index(cfg, env, corpus, cfg.retriever.model, out, dataclasses.replace(cfg.index, kind=m.index))
    ranked = topk(cfg, env, out, marker, "train", [ex.question for ex in train_set], m.rank_to)
    mined = np.full((len(train_set), m.count), -1, dtype=np.int64)
    for i, ex in enumerate(train_set):
        positives = {corpus.row_of(p) for p in ex.positive_ids}
        keep = [int(r) for r in ranked[i][m.rank_from:] if r >= 0 and int(r) not in positives][:m.count]
        mined[i, :len(keep)] = keep
    return mined


def make_task(cfg: RunConfig, env: D.DistEnv, corpus: Corpus | MemoryCorpus, train_set: list[QAExample],
              model: DualEncoder, tokenizer: Any, mined: np.ndarray | None = None) -> TrainTask:
    """The contrastive task over ``train_set``; passages are read from ``corpus`` by id, batch by batch.
    Negatives per question: those its record lists, then ``mined`` rows (:func:`mine_negatives`), then a
    deterministic filler, ``retriever.hard_negatives`` in all."""
    rc = cfg.retriever
    h = rc.hard_negatives
    max_len = rc.max_length

    def negatives_for(i: int) -> list[str]:
        ex = train_set[i]
        negs = [n for n in ex.hard_negative_ids if n not in ex.positive_ids][:h]
        for row in mined[i] if mined is not None else ():
            cand = corpus.id_of(int(row)) if row >= 0 and len(negs) < h else None
            if cand is not None and cand not in ex.positive_ids and cand not in negs:
                negs.append(cand)
        j = 0
        while len(negs) < h:  # deterministic filler keeps shapes equal across ranks
            cand = corpus.id_of((i * 7919 + j) % corpus.rows)
            if cand not in ex.positive_ids and cand not in negs:
                negs.append(cand)
            j += 1
        return negs

    def make_batch(indices: list[int]) -> dict[str, Any]:
        qs = [train_set[i].question for i in indices]
        pos = [corpus.text_of(train_set[i].positive_ids[0]) for i in indices]
        negs = [corpus.text_of(n) for i in indices for n in negatives_for(i)]
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
        stage=STAGE, model=model, n_examples=len(train_set), global_batch_size=rc.global_batch_size,
        grad_accum=rc.grad_accum, max_steps=rc.max_steps, optim=rc.optim, make_batch=make_batch,
        count=lambda b: int(b["n"]), loss_sum=loss_sum, tokens=lambda b: int(b["attention_mask"].sum()),
        parallelism=rc.parallelism)


def _train(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    out: Path = cfg.stage_dir(STAGE)
    data = load_run_data(cfg, env)
    mined = mine_negatives(cfg, env, data.corpus, data.train) if cfg.retriever.mining.count else None
    if mined is not None:
        log.info("mined %d hard negatives for %d questions (ranks %d-%d of the base encoder's %s index)",
                 int((mined >= 0).sum()), len(data.train), cfg.retriever.mining.rank_from,
                 cfg.retriever.mining.rank_to, cfg.retriever.mining.index)
    seed_everything(cfg.seed)
    model, tokenizer = load_encoder(cfg.retriever.model)
    log.info("retriever: %d train questions, %d passages, world_size=%d, device=%s",
             len(data.train), data.corpus.rows, env.world_size, env.device)
    result = train(make_task(cfg, env, data.corpus, data.train, model, tokenizer, mined), cfg, env, out)
    if result.exit_code != OK:
        return result.exit_code
    if env.is_main:
        save_encoder(model, tokenizer, out / "model")
        log.info("retriever model saved to %s", out / "model")
        mining = {} if mined is None else {"mined_negatives": int((mined >= 0).sum()),
                                           "mining_index": str(out / MINING_DIR)}
        complete_stage(cfg, STAGE, {**result.summary(), "model": str(out / "model"), **mining})
    return OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    return run_stage(cfg, env, STAGE, _train)


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
