"""Evaluate retrieval (recall@k, MRR) and generation (exact match, token F1) on ``data.qa_eval``.

    torchrun --nnodes=N --nproc-per-node=G -m training.evaluate --config RUN.yaml [--key=value ...]
    python -m training.evaluate --config RUN.yaml

Questions are embedded with the index's encoder (sharded across ranks) and searched in
the index; the generator (when its stage is complete) answers greedily from the top
``generator.top_k`` passages, questions sharded across ranks. Rank 0 writes
``<shared>/runs/<run_id>/evaluate/report.json`` and ``_COMPLETE``.
"""

from __future__ import annotations

import collections
import re
import string
import time
from typing import Any

import torch

from training.components import distributed as D
from training.components import heap
from training.components.data import load_datasets
from training.components.logs import get_logger
from training.components.models import load_encoder
from training.components.search import build_faiss, encode_sharded, retrieval_metrics, retrieve, search
from training.components.stage import complete_stage, exit_process, is_complete, run_main, run_stage, write_json_atomic
from training.config import RunConfig
from contract.exit_codes import OK
from training.generator import contexts, encode_prompt, special_ids

STAGE = "evaluate"
REPORT = "report.json"


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def f1_score(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if not p or not g:
        return float(p == g)
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


@torch.no_grad()
def generate_answers(model: torch.nn.Module, tok: Any, prompts: list[list[int]], max_new_tokens: int,
                     device: torch.device) -> list[str]:
    """Greedy answers, one prompt at a time (no padding to get wrong)."""
    sp = special_ids(tok)
    model.eval()
    out = []
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        gen = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=sp.eos, pad_token_id=sp.pad)
        new = gen[0, len(ids):].tolist()
        if sp.eos in new:
            new = new[:new.index(sp.eos)]
        out.append(tok.decode(new, skip_special_tokens=True).strip())
    return out


def _evaluate(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    out = cfg.stage_dir(STAGE)
    e = cfg.evaluate
    t0 = time.monotonic()
    data = load_datasets(cfg.shared_root, cfg.data.corpus, cfg.data.qa_train, cfg.data.qa_eval)
    examples = data.eval[: e.max_questions] if e.max_questions else data.eval
    questions = [ex.question for ex in examples]
    positives = [ex.positive_ids for ex in examples]
    depth = max(max(e.recall_at), cfg.generator.top_k)

    retrieved, marker = retrieve(cfg, env, questions, depth)
    heap.settle()  # the encoder and the index are loaded
    report: dict[str, Any] = {"run_id": cfg.run_id, "questions": len(examples), "world_size": env.world_size,
                              "retrieval": {"encoder": marker.get("encoder") or "all-MiniLM-L6-v2 (pretrained)",
                                            "index": marker.get("kind"),
                                            **retrieval_metrics(retrieved, positives, e.recall_at)}}

    if e.compare_pretrained:
        base, base_tok = load_encoder(cfg.retriever.model)
        base.to(env.device)
        p_emb = encode_sharded(env, base, base_tok, [p.text for p in data.corpus], cfg.retriever.max_length,
                               cfg.index.batch_size)
        q_emb = encode_sharded(env, base, base_tok, questions, cfg.retriever.max_length, cfg.index.batch_size)
        del base
        flat = build_faiss(p_emb.numpy(), "flat", 1, 1, 1, 1)
        base_ret = search(flat, q_emb, [p.id for p in data.corpus], depth)
        report["retrieval_pretrained"] = {"encoder": cfg.retriever.model or "all-MiniLM-L6-v2 (pretrained)",
                                          **retrieval_metrics(base_ret, positives, e.recall_at)}

    gen_dir = cfg.stage_dir("generator")
    if is_complete(gen_dir):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gen_dir / "model"))
        model = AutoModelForCausalLM.from_pretrained(str(gen_dir / "model")).to(env.device)
        sp = special_ids(tok)
        k = cfg.generator.top_k
        ctx = contexts(data, examples, retrieved, k, include_gold=False)
        budget = cfg.generator.max_length - e.max_new_tokens
        mine = list(range(env.rank, len(examples), env.world_size))
        prompts = [encode_prompt(tok, sp, questions[i], ctx[i], budget) for i in mine]
        answers = generate_answers(model, tok, prompts, e.max_new_tokens, env.device)
        gathered = D.all_gather_object(env, list(zip(mine, answers)))
        preds = dict(pair for part in gathered for pair in part)
        em = [exact_match(preds[i], examples[i].answer) for i in range(len(examples))]
        f1 = [f1_score(preds[i], examples[i].answer) for i in range(len(examples))]
        report["generation"] = {"model": str(gen_dir / "model"), "top_k": k,
                                "exact_match": sum(em) / len(em), "f1": sum(f1) / len(f1),
                                "samples": [{"question": questions[i], "gold": examples[i].answer,
                                             "predicted": preds[i]} for i in range(min(5, len(examples)))]}
    else:
        report["generation"] = None
        log.info("generator stage not complete: generation metrics skipped")
    report["seconds"] = time.monotonic() - t0
    if env.is_main:
        write_json_atomic(out / REPORT, report)
        log.info("evaluation report: %s", out / REPORT)
        complete_stage(cfg, STAGE, {"report": str(out / REPORT)})
    return OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    return run_stage(cfg, env, STAGE, _evaluate)


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
