"""Encode the corpus sharded across ranks, gather, build a FAISS index and save it with its id map.

    torchrun --nnodes=N --nproc-per-node=G -m training.index --config RUN.yaml [--key=value ...]
    python -m training.index --config RUN.yaml

Encoder: the retriever stage's output when it is complete (``index.use_finetuned``), else
``retriever.model``. Output: ``<shared>/runs/<run_id>/index/{index.faiss, ids.json, _COMPLETE}``;
the marker records the encoder so later stages embed questions with the same model.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from training.components import distributed as D
from training.components import heap
from training.components.data import load_corpus, resolve_confined
from training.components.logs import get_logger
from training.components.models import load_encoder
from training.components.search import build_faiss, encode_sharded, retriever_model_path, save_index
from training.components.stage import complete_stage, exit_process, run_main, run_stage
from training.config import RunConfig
from contract.exit_codes import OK

if TYPE_CHECKING:
    import numpy as np

STAGE = "index"


def write_index(cfg: RunConfig, ids: list[str], emb: "np.ndarray", encoder_path: str, encode_s: float) -> None:
    """Build the FAISS index over ``emb`` (rows in ``ids`` order), save it with its id map, mark the stage
    complete. The one writer of the index stage's outputs (torchrun ranks and Ray tasks alike)."""
    ic = cfg.index
    out = cfg.stage_dir(STAGE)
    index = build_faiss(emb, ic.kind, ic.nlist, ic.nprobe, ic.hnsw_m, ic.hnsw_ef_search)
    save_index(index, ids, out)
    complete_stage(cfg, STAGE, {"kind": ic.kind, "nprobe": ic.nprobe, "hnsw_ef_search": ic.hnsw_ef_search,
                                "encoder": encoder_path, "max_length": cfg.retriever.max_length,
                                "passages": len(ids), "dim": int(emb.shape[1]), "encode_seconds": encode_s})


def _index(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    corpus = load_corpus(resolve_confined(cfg.shared_root, cfg.data.corpus, "data.corpus"))
    encoder_path = retriever_model_path(cfg, cfg.index.use_finetuned)
    model, tokenizer = load_encoder(encoder_path)
    model.to(env.device)
    heap.settle()
    t0 = time.monotonic()
    emb = encode_sharded(env, model, tokenizer, [p.text for p in corpus], cfg.retriever.max_length,
                         cfg.index.batch_size)
    encode_s = time.monotonic() - t0
    if env.is_main:
        write_index(cfg, [p.id for p in corpus], emb.numpy(), encoder_path, encode_s)
        log.info("indexed %d passages (%s, dim %d) in %.1fs -> %s", len(corpus), cfg.index.kind, emb.shape[1],
                 encode_s, cfg.stage_dir(STAGE))
    return OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    return run_stage(cfg, env, STAGE, _index)


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
