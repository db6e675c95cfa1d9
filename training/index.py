"""Encode the corpus sharded across ranks, gather, build a FAISS index and save it with its id map.

    torchrun --nnodes=N --nproc-per-node=G -m training.index --config RUN.yaml [--key=value ...]
    python -m training.index --config RUN.yaml

Encoder: the retriever stage's output when it is complete (``index.use_finetuned``), else
``retriever.model``. Output: ``<shared>/runs/<run_id>/index/{index.faiss, ids.json, _COMPLETE}``;
the marker records the encoder so later stages embed questions with the same model.
"""

from __future__ import annotations

import sys
import time

from training.components import distributed as D
from training.components.stage import is_complete, mark_complete
from training.config import RunConfig
from training.components.data import load_corpus, resolve_confined
from training.exit_codes import OK
from training.components.logs import get_logger
from training.components.models import load_encoder
from training.components.search import build_faiss, encode_sharded, retriever_model_path, save_index

STAGE = "index"


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger(STAGE, env.is_main)
    out = cfg.stage_dir(STAGE)
    if is_complete(out):
        log.info("%s is complete; nothing to do", out)
        return OK
    corpus = load_corpus(resolve_confined(cfg.shared_root, cfg.data.corpus, "data.corpus"))
    encoder_path = retriever_model_path(cfg, cfg.index.use_finetuned)
    model, tokenizer = load_encoder(encoder_path)
    model.to(env.device)
    t0 = time.monotonic()
    emb = encode_sharded(env, model, tokenizer, [p.text for p in corpus], cfg.retriever.max_length,
                         cfg.index.batch_size)
    encode_s = time.monotonic() - t0
    if env.is_main:
        ic = cfg.index
        index = build_faiss(emb.numpy(), ic.kind, ic.nlist, ic.nprobe, ic.hnsw_m, ic.hnsw_ef_search)
        save_index(index, [p.id for p in corpus], out)
        mark_complete(out, {"stage": STAGE, "kind": ic.kind, "nprobe": ic.nprobe, "hnsw_ef_search": ic.hnsw_ef_search,
                            "encoder": encoder_path, "max_length": cfg.retriever.max_length,
                            "passages": len(corpus), "dim": int(emb.shape[1]), "encode_seconds": encode_s})
        log.info("indexed %d passages (%s, dim %d) in %.1fs -> %s", len(corpus), ic.kind, emb.shape[1], encode_s, out)
    D.barrier(env)
    return OK


def main(argv: list[str] | None = None) -> int:
    from training.components.stage import run_main

    return run_main(STAGE, run, argv)


if __name__ == "__main__":
    sys.exit(main())
