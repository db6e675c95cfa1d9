"""training.demo.synthetic: deterministic, answerable only from the passage, entity-disjoint split."""

from __future__ import annotations

import re
import subprocess
import sys

from training.demo.synthetic import generate
from tests.support.training import REPO, stage_env


def test_same_seed_same_bytes_and_cli(tmp_path) -> None:
    for d in ("a", "b"):
        subprocess.run([sys.executable, "-m", "training.demo.synthetic", "--out", str(tmp_path / d), "--seed", "5",
                        "--n-entities", "12"], cwd=REPO, env=stage_env(), check=True, capture_output=True)
    for name in ("corpus.jsonl", "qa_train.jsonl", "qa_eval.jsonl", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert generate(5, 12) != generate(6, 12)


def test_answers_are_in_the_positive_passage_and_not_in_the_question() -> None:
    data = generate(0, 30)
    text = {p["id"]: p["text"] for p in data["corpus"]}
    for ex in data["qa_train"] + data["qa_eval"]:
        assert ex["answer"] in text[ex["positive_ids"][0]]
        assert not re.search(rf"\b{re.escape(ex['answer'].lower())}\b", ex["question"].lower())
        assert ex["positive_ids"][0] not in ex["hard_negative_ids"]


def test_eval_entities_are_never_trained_on() -> None:
    data = generate(1, 25)
    ent = lambda ex: ex["positive_ids"][0].split("-")[0]  # noqa: E731
    train = {ent(ex) for ex in data["qa_train"]}
    evals = {ent(ex) for ex in data["qa_eval"]}
    assert train and evals and not train & evals
    assert len(data["corpus"]) == 25 * 6


def test_bad_arguments_exit_2(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "training.demo.synthetic", "--out", str(tmp_path), "--n-entities", "2"],
                         cwd=REPO, env=stage_env(), capture_output=True, text=True)
    assert out.returncode == 2 and "n_entities=2" in out.stderr
