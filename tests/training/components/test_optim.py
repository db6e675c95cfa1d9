"""training.components.optim: warmup + cosine schedule and weight-decay groups."""

from __future__ import annotations

import pytest
import torch

from training.config.sections import OptimConfig
from training.components.optim import build_optimizer, build_scheduler, lr_factor


def test_warmup_then_cosine_to_floor() -> None:
    f = [lr_factor(s, warmup_steps=4, max_steps=20, min_lr_ratio=0.1) for s in range(21)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[4:], f[5:]))  # monotone decay after warmup
    assert f[12] == pytest.approx(0.1 + 0.9 * 0.5)  # half way
    assert f[20] == pytest.approx(0.1)


def test_scheduler_drives_optimizer_lr_and_no_decay_on_biases() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimConfig(lr=1.0, weight_decay=0.1, warmup_steps=2))
    assert [len(g["params"]) for g in opt.param_groups] == [1, 3]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    sched = build_scheduler(opt, OptimConfig(lr=1.0, warmup_steps=2, min_lr_ratio=0.0), max_steps=4)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])


def test_cpu_optimizer_is_fused_and_matches_the_reference_adamw() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
    reference = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
    reference.load_state_dict(model.state_dict())
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    opt = build_optimizer(model, cfg)
    assert opt.defaults["fused"] is True
    ref_opt = torch.optim.AdamW([{"params": [reference[0].weight], "weight_decay": 0.1},
                                 {"params": [reference[0].bias, *reference[1].parameters()], "weight_decay": 0.0}],
                                lr=1e-2, betas=tuple(cfg.betas), foreach=False)
    x = torch.randn(8, 64)
    for _ in range(5):
        for m, o in ((model, opt), (reference, ref_opt)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert not torch.equal(a, torch.zeros_like(a))
        # Same update up to rounding (a wrong lr or missing decay moves weights by >= 1e-4).
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
