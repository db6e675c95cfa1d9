"""AdamW with decoupled weight decay (not on biases/norms) and linear warmup + cosine decay."""

from __future__ import annotations

import math

import torch

from training.config.sections import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # 1-D tensors are biases and norm scales: decaying them only hurts.
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    params = decay + no_decay
    if params and len({p.device.type for p in params}) == 1 and params[0].device.type in ("cpu", "cuda"):
        # One fused kernel per tensor and no scratch tensors per step (the per-tensor path
        # allocates temporaries as large as the embedding table); element-wise, so as
        # deterministic as that path and resume stays bit-exact.
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=False)


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.warmup_steps, max_steps, cfg.min_lr_ratio))
