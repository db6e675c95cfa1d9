"""JSONL datasets, validated record by record, and paths confined to the shared root.

Corpus lines: ``{"id": str, "text": str}``.
QA lines: ``{"question": str, "answer": str, "positive_ids": [str, ...]}`` plus an
optional ``"hard_negative_ids": [str, ...]``.

A bad file raises :class:`DataError` listing every bad record as ``file:line: problem``
(up to a limit), so one run reports all of them instead of one per retry.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from contract import paths

_MAX_REPORTED = 20


class DataError(ValueError):
    """A dataset file or path is invalid; the message gives file:line and the problem."""


@dataclass(frozen=True)
class Passage:
    id: str
    """Unique passage id."""
    text: str
    """Passage text."""


@dataclass(frozen=True)
class QAExample:
    question: str
    """Question text."""
    answer: str
    """Reference answer."""
    positive_ids: tuple[str, ...]
    """Ids of corpus passages that contain the answer."""
    hard_negative_ids: tuple[str, ...] = field(default=())
    """Ids of passages that look relevant but are not."""


def resolve_confined(shared_root: str | os.PathLike[str], rel: str, what: str = "path") -> Path:
    """:func:`contract.paths.resolve_confined`, its refusal raised as :class:`DataError` naming ``what``."""
    try:
        return paths.resolve_confined(shared_root, rel)
    except paths.PathError as err:
        raise DataError(f"{what}={rel!r}: {err}") from None


def _read_jsonl(path: Path) -> list[tuple[int, object | Exception]]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    out: list[tuple[int, object | Exception]] = []
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                out.append((lineno, json.loads(line)))
            except json.JSONDecodeError as err:
                out.append((lineno, err))
    return out


def _objects(path: Path, errors: list[str]) -> Iterator[tuple[int, str, dict]]:
    """(line number, "file:line", record) for each JSON object line; other lines become errors."""
    for lineno, rec in _read_jsonl(path):
        where = f"{path}:{lineno}"
        if isinstance(rec, Exception):
            errors.append(f"{where}: invalid JSON ({rec.msg})")
        elif not isinstance(rec, dict):
            errors.append(f"{where}: record must be a JSON object, got {type(rec).__name__}")
        else:
            yield lineno, where, rec


def _raise_if(errors: list[str], path: Path) -> None:
    if errors:
        more = f"\n... and {len(errors) - _MAX_REPORTED} more" if len(errors) > _MAX_REPORTED else ""
        raise DataError(f"{path}: {len(errors)} bad record(s):\n" + "\n".join(errors[:_MAX_REPORTED]) + more)


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def load_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """Read and validate a corpus file (unique non-empty string ids, non-empty text)."""
    path = Path(path)
    errors: list[str] = []
    passages: list[Passage] = []
    seen: dict[str, int] = {}
    for lineno, where, rec in _objects(path, errors):
        extra = set(rec) - {"id", "text"}
        pid, text = rec.get("id"), rec.get("text")
        if not isinstance(pid, str) or not pid:
            errors.append(f"{where}: field 'id' must be a non-empty string, got {pid!r}")
        elif pid in seen:
            errors.append(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
        if not isinstance(text, str) or not text.strip():
            errors.append(f"{where}: field 'text' must be a non-empty string, got {text!r}")
        if extra:
            errors.append(f"{where}: unknown field(s) {sorted(extra)}")
        if isinstance(pid, str) and pid and pid not in seen and isinstance(text, str) and text.strip() and not extra:
            seen[pid] = lineno
            passages.append(Passage(pid, text))
    _raise_if(errors, path)
    if not passages:
        raise DataError(f"{path}: corpus is empty")
    return passages


def check_qa_record(where: str, rec: dict, errors: list[str]) -> None:
    """Append to ``errors`` what is wrong with one QA record (a JSON object), each prefixed by ``where``: the
    record shape every stage reads (the submit checks, training/scheduler/submit_checks.py, use it too)."""
    for key in ("question", "answer"):
        v = rec.get(key)
        if not isinstance(v, str) or not v.strip():
            errors.append(f"{where}: field {key!r} must be a non-empty string, got {v!r}")
    pos = rec.get("positive_ids")
    if not _str_list(pos) or not pos:
        errors.append(f"{where}: field 'positive_ids' must be a non-empty list of ids, got {pos!r}")
    neg = rec.get("hard_negative_ids", [])
    if not _str_list(neg):
        errors.append(f"{where}: field 'hard_negative_ids' must be a list of ids, got {neg!r}")
    extra = set(rec) - _QA_FIELDS
    if extra:
        errors.append(f"{where}: unknown field(s) {sorted(extra)}")


_QA_FIELDS = frozenset({"question", "answer", "positive_ids", "hard_negative_ids"})


def load_qa(path: str | os.PathLike[str], corpus_ids: set[str] | None = None) -> list[QAExample]:
    """Read and validate a QA file; with ``corpus_ids``, every referenced id must exist."""
    path = Path(path)
    errors: list[str] = []
    examples: list[QAExample] = []
    for lineno, where, rec in _objects(path, errors):
        bad = len(errors)
        check_qa_record(where, rec, errors)
        pos, neg = rec.get("positive_ids"), rec.get("hard_negative_ids", [])
        if corpus_ids is not None and len(errors) == bad:
            missing = [i for i in list(pos) + list(neg) if i not in corpus_ids]
            if missing:
                errors.append(f"{where}: id(s) not in the corpus: {missing[:5]}")
        if len(errors) == bad:
            examples.append(QAExample(rec["question"], rec["answer"], tuple(pos), tuple(neg)))
    _raise_if(errors, path)
    if not examples:
        raise DataError(f"{path}: no QA records")
    return examples


@dataclass
class Datasets:
    corpus: list[Passage]
    """All passages."""
    train: list[QAExample]
    """Training questions."""
    eval: list[QAExample]
    """Evaluation questions."""

    def passage_index(self) -> dict[str, int]:
        return {p.id: i for i, p in enumerate(self.corpus)}


def load_datasets(shared_root: str, corpus: str, qa_train: str, qa_eval: str) -> Datasets:
    """Load and cross-validate the three files named (relative to ``shared_root``) in the config."""
    c = load_corpus(resolve_confined(shared_root, corpus, "data.corpus"))
    ids = {p.id for p in c}
    return Datasets(
        corpus=c,
        train=load_qa(resolve_confined(shared_root, qa_train, "data.qa_train"), ids),
        eval=load_qa(resolve_confined(shared_root, qa_eval, "data.qa_eval"), ids),
    )


class ResumableOrder:
    """Seeded, resumable, rank-sharded order over a dataset of ``n`` items.

    Step ``s`` uses global batch ``perm_e[j*B:(j+1)*B]`` of epoch ``e`` (a fresh
    permutation per epoch, seeded by ``seed + e``, incomplete tail dropped), so the
    position is fully described by the step number and 1 process and N processes see
    the same global batches. Rank ``r`` takes the ``r``-th contiguous slice.
    """

    def __init__(self, n: int, global_batch: int, seed: int) -> None:
        if n < global_batch:
            raise DataError(f"dataset has {n} items, fewer than global_batch_size={global_batch}")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.batches_per_epoch = n // global_batch
        self._cache: tuple[int, list[int]] | None = None

    def _perm(self, epoch: int) -> list[int]:
        if self._cache is None or self._cache[0] != epoch:
            import torch

            g = torch.Generator().manual_seed(self.seed + epoch)
            self._cache = (epoch, torch.randperm(self.n, generator=g).tolist())
        return self._cache[1]

    def position(self, step: int) -> dict[str, int]:
        """Epoch and batch-in-epoch of optimizer step ``step`` (0-based)."""
        return {"epoch": step // self.batches_per_epoch, "batch_in_epoch": step % self.batches_per_epoch}

    def global_batch_indices(self, step: int) -> list[int]:
        pos = self.position(step)
        perm = self._perm(pos["epoch"])
        j = pos["batch_in_epoch"]
        return perm[j * self.global_batch:(j + 1) * self.global_batch]

    def rank_batch_indices(self, step: int, rank: int, world: int) -> list[int]:
        batch = self.global_batch_indices(step)
        per = len(batch) // world
        return batch[rank * per:(rank + 1) * per]
