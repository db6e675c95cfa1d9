"""Encode the corpus part by part on every rank, build a FAISS index from the parts and save it.

    torchrun --nnodes=N --nproc-per-node=G -m training.index --config RUN.yaml [--key=value ...]
    python -m training.index --config RUN.yaml

Encoder: the retriever stage's output when it is complete (``index.use_finetuned``), else
``retriever.model``. Each rank streams its parts of the corpus (``index.part_rows`` rows each, round
robin) and writes their embeddings to ``index/embeddings/``; nothing is gathered, and a killed stage
resumes from the parts already written and verified. ``flat``/``ivf``/``hnsw`` are then built by rank 0
from the parts; ``ivfpq`` is trained by rank 0 on a sample, each rank adds its own parts, and rank 0
merges them on disk (:mod:`training.components.faiss_index`). Output:
``<shared>/runs/<run_id>/index/{index.faiss[, index.ivfdata], _COMPLETE}``; a passage's FAISS id is its
corpus row, and the marker records the encoder so later stages embed questions with the same model.
"""

from __future__ import annotations

from training.components import distributed as D
from training.components import heap
from training.components.logs import get_logger
from training.components.run_data import open_corpus
from training.components.search import build_index, finish_index, retriever_model_path
from training.components.stage import complete_stage, exit_process, run_main, run_stage
from training.config.run import RunConfig
from contract.exit_codes import OK

STAGE = "index"


def _index(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    corpus = open_corpus(cfg, env)
    encoder_path = retriever_model_path(cfg, cfg.index.use_finetuned)
    heap.settle()
    out = cfg.stage_dir(STAGE)
    summary = build_index(cfg, env, corpus, encoder_path, out)
    if env.is_main:
        complete_stage(cfg, STAGE, summary)
        finish_index(out)
        log.info("indexed %d passages (%s, dim %d, %d parts, %d resumed) in %.1fs -> %s (%d bytes)",
                 corpus.rows, cfg.index.kind, summary["dim"], summary["parts"], summary["parts_resumed"],
                 summary["encode_seconds"], out, summary["index_bytes"])
    return OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    return run_stage(cfg, env, STAGE, _index)


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
