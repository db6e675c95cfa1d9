"""Fine-tune a causal LM to answer from retrieved passages; loss on answer tokens only.

    torchrun --nnodes=N --nproc-per-node=G -m training.generator --config RUN.yaml [--key=value ...]
    python -m training.generator --config RUN.yaml
    torchrun --nproc-per-node=8 -m training.generator --config RUN.yaml --generator.parallelism.strategy=fsdp

Prompt: ``question: Q context: P1 | P2 ... answer:`` with the top ``generator.top_k``
passages retrieved by the index stage's encoder and index, then the answer and an end
token. ``generator.model`` empty builds a tiny Llama/GPT-2 locally (``generator.tiny``)
with the MiniLM WordPiece tokenizer, so nothing is downloaded. Output:
``<shared>/runs/<run_id>/generator/model/`` (Hugging Face format) and ``_COMPLETE``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from training.components import distributed as D
from training.components import sharding as S
from training.components.corpus import Corpus
from training.components.data import QAExample
from training.components.logs import get_logger
from training.components.loop import TrainTask, seed_everything, train
from training.components.run_data import load_run_data
from training.components.search import open_index_marker, topk
from training.components.stage import complete_stage, exit_process, run_main, run_stage
from training.config.run import RunConfig
from contract.exit_codes import OK

if TYPE_CHECKING:
    import numpy as np

STAGE = "generator"
IGNORE = -100


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    """Prepended to every sequence (``[CLS]`` / ``<s>``), if the tokenizer has one."""
    eos: int
    """Ends an answer (``[SEP]`` / ``</s>``)."""
    pad: int
    """Padding id (labels there are ignored)."""


def special_ids(tok: Any) -> SpecialIds:
    bos = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
    eos = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    if eos is None:
        raise ValueError("generator tokenizer has neither sep_token nor eos_token to end answers")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    return SpecialIds(bos, eos, pad)


def encode_prompt(tok: Any, sp: SpecialIds, question: str, passages: list[str], budget: int) -> list[int]:
    """Token ids of the prompt, cutting the context (never the question or the cue) to ``budget``."""
    head = tok(f"question: {question} context:", add_special_tokens=False)["input_ids"]
    ctx = tok(" | ".join(passages), add_special_tokens=False)["input_ids"]
    cue = tok(" answer:", add_special_tokens=False)["input_ids"]
    start = [sp.bos] if sp.bos is not None else []
    room = budget - len(start) - len(head) - len(cue)
    if room < 0:
        head = head[:max(0, budget - len(start) - len(cue))]
        room = 0
    return start + head + ctx[:room] + cue


def encode_example(tok: Any, sp: SpecialIds, question: str, passages: list[str], answer: str,
                   max_length: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` with labels only on the answer and its end token."""
    ans = tok(" " + answer, add_special_tokens=False)["input_ids"] + [sp.eos]
    ans = ans[: max(1, max_length // 2)]
    prompt = encode_prompt(tok, sp, question, passages, max_length - len(ans))
    return prompt + ans, [IGNORE] * len(prompt) + ans


def context(corpus: Corpus, ex: QAExample, retrieved: "np.ndarray", k: int, include_gold: bool) -> list[str]:
    """The passages of one prompt: the top ``k`` corpus rows retrieved for ``ex`` (with its first positive in
    the last place when ``include_gold`` and none was retrieved), read from the corpus by row."""
    chosen = [int(r) for r in retrieved[:k] if r >= 0]
    if include_gold and chosen:
        gold = [corpus.row_of(g) for g in ex.positive_ids]
        if not any(g in chosen for g in gold):
            chosen[-1] = gold[0]  # type: ignore[assignment]
    return corpus.texts(chosen)


def load_or_build_model(cfg: RunConfig) -> tuple[torch.nn.Module, Any]:
    """The generator and its tokenizer. A pretrained model under fsdp/hsdp is built with meta parameters
    (no memory): the trainer shards it, then each rank loads only its slices (:func:`make_task`)."""
    from training.components.models import (AutoConfig, build_tiny_causal_lm, load_causal_lm,
                                            load_generator_tokenizer)

    g = cfg.generator
    if g.model and g.parallelism.sharded:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with S.params_on_meta():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(g.model))
        return model, AutoTokenizer.from_pretrained(g.model)
    if g.model:
        return load_causal_lm(g.model)
    tok = load_generator_tokenizer(g.tokenizer)
    t = g.tiny
    model = build_tiny_causal_lm(tok, t.arch, t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size,
                                 max(t.max_position, g.max_length), cfg.seed)
    return model, tok


def pad_batch(seqs: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    n = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), n), pad, dtype=torch.long)
    labels = torch.full((len(seqs), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, (s, lab) in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        labels[i, :len(lab)] = torch.tensor(lab)
        mask[i, :len(s)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class AnswerLoss(torch.nn.Module):
    """Wraps a causal LM so its forward returns the summed loss on answer tokens only.

    The output projection runs only at positions that predict an answer token, not over
    the whole prompt: with a 30k vocabulary and long prompts that projection would
    otherwise dominate the step. Falls back to full logits for models whose base/head
    split is not exposed.
    """

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm
        # Looked up per call, not stored: storing would register the modules twice.
        self._base_name = getattr(lm, "base_model_prefix", "")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        targets = labels[:, 1:]
        keep = targets != IGNORE
        base = getattr(self.lm, self._base_name, None) if self._base_name else None
        head = self.lm.get_output_embeddings() if hasattr(self.lm, "get_output_embeddings") else None
        if isinstance(base, torch.nn.Module) and isinstance(head, torch.nn.Module) and base is not self.lm:
            hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            logits = head(hidden[:, :-1][keep])
        else:
            logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1][keep]
        return F.cross_entropy(logits.float(), targets[keep], reduction="sum")


def answer_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    return model(batch["input_ids"].to(device), batch["attention_mask"].to(device), batch["labels"].to(device))


def make_task(cfg: RunConfig, model: torch.nn.Module, tok: Any, n_examples: int,
              encode: Callable[[int], tuple[list[int], list[int]]]) -> TrainTask:
    """The answer-loss task over ``n_examples``; ``encode(i)`` builds example ``i`` when a batch needs it."""
    g = cfg.generator
    pad = special_ids(tok).pad
    on_meta = any(p.is_meta for p in model.parameters())
    return TrainTask(
        stage=STAGE, model=AnswerLoss(model), n_examples=n_examples, global_batch_size=g.global_batch_size,
        grad_accum=g.grad_accum, max_steps=g.max_steps, optim=g.optim,
        make_batch=lambda idx: pad_batch([encode(i) for i in idx], pad),
        count=lambda b: int((b["labels"][:, 1:] != IGNORE).sum()),
        loss_sum=answer_loss_sum, tokens=lambda b: int(b["attention_mask"].sum()), parallelism=g.parallelism,
        load_weights=(lambda m, device: S.load_safetensors_sharded(m, device, Path(g.model), prefix="lm."))
        if on_meta else None)


def _train(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    out = cfg.stage_dir(STAGE)
    g = cfg.generator
    data = load_run_data(cfg, env)
    index_dir = cfg.stage_dir("index")
    # Every training question's top-k, computed once across the ranks; a rank reads only its batches' rows.
    retrieved = topk(cfg, env, index_dir, open_index_marker(index_dir), "train", [ex.question for ex in data.train],
                     g.top_k)
    seed_everything(cfg.seed)
    model, tok = load_or_build_model(cfg)
    sp = special_ids(tok)

    def encode(i: int) -> tuple[list[int], list[int]]:
        ex = data.train[i]
        return encode_example(tok, sp, ex.question, context(data.corpus, ex, retrieved[i], g.top_k, g.include_gold),
                              ex.answer, g.max_length)

    n_params = sum(p.numel() for p in model.parameters())
    log.info("generator: %d examples, %.2fM params, top_k=%d, world_size=%d", len(data.train), n_params / 1e6,
             g.top_k, env.world_size)
    task = make_task(cfg, model, tok, len(data.train), encode)
    result = train(task, cfg, env, out)
    if result.exit_code != OK:
        return result.exit_code
    # Sharded: gathered tensor by tensor into rank 0's CPU memory (a collective), never whole on a GPU.
    full = S.full_model_state(task.model) if S.is_sharded(task.model) else None
    if env.is_main:
        (out / "model").mkdir(parents=True, exist_ok=True)
        if full is None:
            model.save_pretrained(out / "model")
        else:  # the HF model's own names (no "lm." of the AnswerLoss wrapper), tied copies left out as HF does
            tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - \
                {n for n, _ in model.named_parameters()}
            model.save_pretrained(out / "model", state_dict={
                name: v for k, v in full.items() if (name := k.removeprefix("lm.")) not in tied})
        tok.save_pretrained(out / "model")
        log.info("generator model saved to %s", out / "model")
        complete_stage(cfg, STAGE, {**result.summary(prefix="answer_"), "params": n_params,
                                    "model": str(out / "model")})
    return OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    return run_stage(cfg, env, STAGE, _train)


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
