"""Evaluate retrieval (recall@k, MRR) and generation (exact match, token F1) on ``data.qa_eval``.

    torchrun --nnodes=N --nproc-per-node=G -m training.evaluate --config RUN.yaml [--key=value ...]
    python -m training.evaluate --config RUN.yaml

Each question's top-k is computed once (questions shared across the ranks, embedded with the index's
encoder and searched in the index) and stored with the index (:func:`training.components.search.topk`);
the generator (when its stage is complete) answers greedily from the top ``generator.top_k`` passages,
read from the corpus by row, questions sharded across ranks. ``evaluate.compare_pretrained`` builds the
pretrained encoder's index through the same sharded path in ``evaluate/baseline_index/``. Rank 0 writes
``<shared>/runs/<run_id>/evaluate/report.json`` and ``_COMPLETE``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
import time
from typing import TYPE_CHECKING, Any

import torch

from training.components import distributed as D
from training.components import heap
from training.components.corpus import Corpus
from training.components.logs import get_logger
from training.components.run_data import load_run_data, positive_rows
from training.components.search import auxiliary_index, open_index_marker, retrieval_metrics, topk
from training.components.stage import complete_stage, exit_process, is_complete, run_main, run_stage, write_json_atomic
from training.config.run import RunConfig
from contract.exit_codes import OK
from training.generator import context, encode_prompt, special_ids

if TYPE_CHECKING:
    import numpy as np

STAGE = "evaluate"
REPORT = "report.json"
BASELINE_DIR = "baseline_index"


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


def _lists(rows: "np.ndarray") -> list[list[int]]:
    return [[int(r) for r in row if r >= 0] for row in rows]


def _baseline(cfg: RunConfig, env: D.DistEnv, corpus: Corpus, questions: list[str], depth: int) -> "np.ndarray":
    """The pretrained encoder's top-k through the same sharded path as the run's own index (parts on disk,
    never gathered), in ``evaluate/baseline_index/``: exact (``flat``) unless the run's index is ``ivfpq``,
    whose kind it then shares (a corpus too large for one process)."""
    ic = cfg.index if cfg.index.kind == "ivfpq" else dataclasses.replace(cfg.index, kind="flat")
    out = cfg.stage_dir(STAGE) / BASELINE_DIR
    return topk(cfg, env, out, auxiliary_index(cfg, env, corpus, cfg.retriever.model, out, ic), "eval", questions,
                depth)


def _evaluate(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    out = cfg.stage_dir(STAGE)
    e = cfg.evaluate
    t0 = time.monotonic()
    data = load_run_data(cfg, env)
    examples = data.eval[: e.max_questions] if e.max_questions else data.eval
    questions = [ex.question for ex in examples]
    positives = positive_rows(data.corpus, examples)
    depth = max(max(e.recall_at), cfg.generator.top_k)

    index_dir = cfg.stage_dir("index")
    marker = open_index_marker(index_dir)
    retrieved = topk(cfg, env, index_dir, marker, "eval", questions, depth)
    heap.settle()
    report: dict[str, Any] = {"run_id": cfg.run_id, "questions": len(examples), "world_size": env.world_size,
                              "retrieval": {"encoder": marker.get("encoder") or "all-MiniLM-L6-v2 (pretrained)",
                                            "index": marker.get("kind"),
                                            **retrieval_metrics(_lists(retrieved), positives, e.recall_at)}}

    if e.compare_pretrained:
        report["retrieval_pretrained"] = {"encoder": cfg.retriever.model or "all-MiniLM-L6-v2 (pretrained)",
                                          **retrieval_metrics(_lists(_baseline(cfg, env, data.corpus, questions,
                                                                               depth)), positives, e.recall_at)}

    gen_dir = cfg.stage_dir("generator")
    if is_complete(gen_dir):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gen_dir / "model"))
        model = AutoModelForCausalLM.from_pretrained(str(gen_dir / "model")).to(env.device)
        sp = special_ids(tok)
        k = cfg.generator.top_k
        budget = cfg.generator.max_length - e.max_new_tokens
        mine = list(range(env.rank, len(examples), env.world_size))
        prompts = [encode_prompt(tok, sp, questions[i], context(data.corpus, examples[i], retrieved[i], k, False),
                                 budget) for i in mine]
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
