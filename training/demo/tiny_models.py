"""Tiny models built locally for tests and benchmarks (no download): seconds per step on a CPU."""

from __future__ import annotations

from pathlib import Path


def build_tiny_encoder(out: Path) -> Path:
    """Save a 2-layer, 32-wide BERT with the packaged MiniLM WordPiece tokenizer (dropout 0.1:
    RNG state matters on resume) to ``out``; reuse what is already there."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from training.components.models import default_encoder_path

    tok = AutoTokenizer.from_pretrained(str(default_encoder_path()))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
