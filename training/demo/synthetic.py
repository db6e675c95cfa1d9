"""Deterministic synthetic RAG dataset: facts about fictional entities.

Every entity gets one passage per attribute (birthplace, occupation, pet, instrument,
founding year, motto). Answers are invented words or picked at random per entity, so a
question can only be answered from its passage; questions are paraphrased away from the
passage wording, and passages mention other entities, so retrieval is not a name match.
Entities are split into train / eval: evaluation asks about entities never trained on.

    python -m training.demo.synthetic --out DIR --seed 0 --n-entities 100

writes ``DIR/corpus.jsonl``, ``DIR/qa_train.jsonl``, ``DIR/qa_eval.jsonl`` and
``DIR/manifest.json``. Same arguments, same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

from contract import exit_codes

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br", "kr", "dr", "st", "gl"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou", "ia"]
_CODAS = ["", "n", "r", "l", "s", "th", "x", "nd", "rk", "m"]
_JOBS = ["glassblower", "cartographer", "beekeeper", "lighthouse keeper", "clockmaker", "ferry pilot",
         "herbalist", "stonemason", "archivist", "puppeteer", "rope maker", "astronomer", "tailor", "brewer"]
_ANIMALS = ["heron", "tortoise", "ferret", "raven", "goat", "lizard", "hedgehog", "parrot", "salamander", "hare"]
_INSTRUMENTS = ["cello", "bagpipes", "zither", "oboe", "harp", "accordion", "lute", "marimba", "banjo", "flute"]
_ORG_KINDS = ["guild", "society", "academy", "brotherhood", "league", "circle"]
_MOTTO_WORDS = ["tide", "ember", "lantern", "thorn", "harbor", "willow", "anvil", "compass", "meadow", "frost",
                "ledger", "hollow", "beacon", "orchard", "quarry", "summit"]

# (attribute, passage templates, question templates). Questions avoid the passage's key words.
_ATTRIBUTES: list[tuple[str, list[str], list[str]]] = [
    ("birthplace",
     ["{name} was born in the town of {answer}, far from where {other} grew up.",
      "Records show that {name} came into the world in {answer}; {other} visited there once."],
     ["Which settlement does {name} originally come from?", "What is the hometown of {name}?",
      "Where did {name} spend the first day of life?"]),
    ("occupation",
     ["By trade {name} is a {answer}, and {other} was an early customer.",
      "{name} earns a living as a {answer}, a craft learned alongside {other}."],
     ["What job does {name} do?", "How does {name} make money?", "What is the profession of {name}?"]),
    ("pet",
     ["{name} keeps a {answer} at home, a gift from {other}.",
      "A {answer} lives with {name}; {other} finds the animal strange."],
     ["What kind of animal shares a house with {name}?", "Which creature does {name} look after?",
      "What animal companion does {name} have?"]),
    ("instrument",
     ["In the evenings {name} plays the {answer}, sometimes with {other}.",
      "{name} performs on the {answer} at the winter fair; {other} sings along."],
     ["Which musical instrument is {name} known for?", "What does {name} make music with?",
      "What can you hear {name} practising at night?"]),
    ("founding",
     ["{name} established the {org} in the year {answer}, before {other} joined it.",
      "The {org} was set up by {name} in {answer}; {other} became its treasurer."],
     ["When did {name} start the {org}?", "In what year was the {org} of {name} created?",
      "How long ago, as a year, did the {org} begin?"]),
    ("motto",
     ["The motto that {name} lives by is 'the {answer} remembers', which puzzles {other}.",
      "Carved above the door of {name} is the saying 'the {answer} remembers'; {other} carved it."],
     ["Which word appears in the personal saying of {name}?", "What is the key word of {name}'s motto?",
      "What does {name} claim remembers?"]),
]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def _unique_names(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n:
        name = f"{_word(rng, 2).capitalize()} {_word(rng, 2).capitalize()}"
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def generate(seed: int, n_entities: int, eval_fraction: float = 0.2) -> dict[str, list[dict]]:
    """Build the dataset in memory: ``{"corpus": [...], "qa_train": [...], "qa_eval": [...]}``."""
    if n_entities < 5:
        raise ValueError(f"n_entities={n_entities}: need at least 5 entities")
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction={eval_fraction}: must be in (0, 1)")
    rng = random.Random(seed)
    names = _unique_names(rng, n_entities)
    towns = sorted({_word(rng, 2).capitalize() + rng.choice(["wick", "ford", "holm", "mere", "gate"])
                    for _ in range(n_entities * 2)})
    corpus: list[dict] = []
    qa: list[tuple[int, dict]] = []
    for e, name in enumerate(names):
        org = f"{rng.choice(_MOTTO_WORDS).capitalize()} {rng.choice(_ORG_KINDS).capitalize()}"
        answers = {
            "birthplace": rng.choice(towns),
            "occupation": rng.choice(_JOBS),
            "pet": rng.choice(_ANIMALS),
            "instrument": rng.choice(_INSTRUMENTS),
            "founding": str(rng.randint(1700, 1999)),
            "motto": rng.choice(_MOTTO_WORDS),
        }
        ids = [f"e{e:05d}-{attr}" for attr, _, _ in _ATTRIBUTES]
        for (attr, passages, questions), pid in zip(_ATTRIBUTES, ids):
            other = names[(e + 1 + rng.randrange(n_entities - 1)) % n_entities]
            text = rng.choice(passages).format(name=name, answer=answers[attr], other=other, org=org)
            corpus.append({"id": pid, "text": text})
            question = rng.choice(questions).format(name=name, org=org)
            negatives = [i for i in ids if i != pid]
            rng.shuffle(negatives)
            qa.append((e, {"question": question, "answer": answers[attr], "positive_ids": [pid],
                           "hard_negative_ids": negatives[:2]}))
    order = list(range(n_entities))
    rng.shuffle(order)
    n_eval = max(1, int(round(n_entities * eval_fraction)))
    eval_entities = set(order[:n_eval])
    train = [r for e, r in qa if e not in eval_entities]
    evals = [r for e, r in qa if e in eval_entities]
    rng.shuffle(train)
    return {"corpus": corpus, "qa_train": train, "qa_eval": evals}


def write(out: str | os.PathLike[str], seed: int, n_entities: int, eval_fraction: float = 0.2) -> dict[str, str]:
    """Write the dataset files under ``out`` (atomically per file); return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = generate(seed, n_entities, eval_fraction)
    paths: dict[str, str] = {}
    for name, records in data.items():
        path = out / f"{name}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
        os.replace(tmp, path)
        paths[name] = str(path)
    manifest = {"seed": seed, "n_entities": n_entities, "eval_fraction": eval_fraction,
                "counts": {k: len(v) for k, v in data.items()}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.demo.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same files)")
    parser.add_argument("--n-entities", type=int, default=100, help="fictional entities (6 passages each)")
    parser.add_argument("--eval-fraction", type=float, default=0.2, help="share of entities held out for eval")
    args = parser.parse_args(argv)
    try:
        paths = write(args.out, args.seed, args.n_entities, args.eval_fraction)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
