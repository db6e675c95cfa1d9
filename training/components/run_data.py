"""A run's data as every stage opens it: the corpus by row and id (never loaded), the QA sets validated
against it. The same on every rank and in every Ray task.

``data.corpus`` is a directory prepared in place (``ragpool data prepare``: ``<dir>/_corpus/``), or a
JSONL file or a directory of JSONL shards, prepared once into the run's own ``corpus/`` (rank 0; the
others wait, and every rank raises the same error when the data is bad).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.components import distributed as D
from training.components.corpus import Corpus, open_prepared
from training.components.data import DataError, QAExample, load_qa, resolve_confined
from training.config.run import RunConfig

CORPUS_CACHE_DIR = "corpus"
"""Under ``runs/<run_id>/``: the run's preparation of a corpus not prepared in place."""


@dataclass
class RunData:
    corpus: Corpus
    """The passages, read by row or id."""
    train: list[QAExample]
    """Training questions."""
    eval: list[QAExample]
    """Evaluation questions."""


def corpus_source(cfg: RunConfig) -> Path:
    return resolve_confined(cfg.shared_root, cfg.data.corpus, "data.corpus")


def open_corpus(cfg: RunConfig, env: D.DistEnv | None = None) -> Corpus:
    """The run's corpus; prepared by rank 0 when it must be (one process, no collective, when ``env`` is None)."""
    source = corpus_source(cfg)
    cache = cfg.run_dir() / CORPUS_CACHE_DIR
    if env is None or not env.distributed:
        return open_prepared(source, cache)
    error = None
    if env.is_main:
        try:
            open_prepared(source, cache).close()
        except DataError as err:
            error = str(err)
    error = D.broadcast_object(env, error)
    if error is not None:
        raise DataError(error)
    return open_prepared(source, cache)


def load_run_data(cfg: RunConfig, env: D.DistEnv | None = None) -> RunData:
    corpus = open_corpus(cfg, env)
    return RunData(
        corpus=corpus,
        train=load_qa(resolve_confined(cfg.shared_root, cfg.data.qa_train, "data.qa_train"), corpus),
        eval=load_qa(resolve_confined(cfg.shared_root, cfg.data.qa_eval, "data.qa_eval"), corpus),
    )


def positive_rows(corpus: Corpus, examples: list[QAExample]) -> list[tuple[int, ...]]:
    """Each example's positive ids as corpus rows (load_qa checked they exist)."""
    return [tuple(r for i in ex.positive_ids if (r := corpus.row_of(i)) is not None) for ex in examples]
