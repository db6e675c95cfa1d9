"""A tiny stage for the elastic benchmark and its test (bench/elastic.py, tests/training/elastic/test_launch.py):
least squares on a fixed synthetic set through the real training loop (``training.components.loop.Trainer``: DDP,
checkpoints, resumable order, SIGTERM), cheap enough for several torchrun agents on 2 cores. Its batch settings are the run config's ``retriever`` section (``global_batch_size``,
``grad_accum``, ``max_steps``, ``optim``); the stage writes under ``runs/<run_id>/elastic/``:

- ``steps.jsonl`` (rank 0): one line per optimizer step, ``{"step", "world", "accum", "loss", "t"}`` (``t``: wall clock);
- ``final.pt`` (rank 0): the model's state dict when ``max_steps`` is reached.

A harness paces it with ``hold_at`` in that directory (an integer): every rank waits after a step >= it until the
file is gone or says more, or SIGTERM arrives (which then stops the run as usual at the next step).

    python -m bench.elastic_task --config RUN.yaml                   # one process
    python -m training.elastic.launch --nnodes 2:3 ... -m bench.elastic_task --config RUN.yaml
"""

from __future__ import annotations

import json
import time

import torch

from training.components import distributed as D
from training.components.loop import Trainer, TrainTask, seed_everything
from training.components.stage import exit_process, run_main
from training.config.run import RunConfig
from contract.exit_codes import OK

STAGE = "elastic"
N_EXAMPLES = 240
FEATURES = 8
STEP_PAUSE_S = 0.03
"""Each rank sleeps this long per step (a step of this task is otherwise far shorter than a restart)."""
STEPS_FILE = "steps.jsonl"
HOLD_FILE = "hold_at"
FINAL_FILE = "final.pt"


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N_EXAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    return x, x @ w + 0.01 * torch.randn(N_EXAMPLES, 1, generator=g)


def _hold_at(out) -> float:
    try:
        return int((out / HOLD_FILE).read_text())
    except (OSError, ValueError):  # none (or being written): no hold
        return float("inf")


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    x, y = _data()
    seed_everything(cfg.seed)
    model = torch.nn.Linear(FEATURES, 1)
    rc = cfg.retriever
    task = TrainTask(
        stage=STAGE, model=model, n_examples=N_EXAMPLES, global_batch_size=rc.global_batch_size,
        grad_accum=rc.grad_accum, max_steps=rc.max_steps, optim=rc.optim,
        make_batch=lambda idx: (x[idx], y[idx]), count=lambda b: len(b[0]),
        loss_sum=lambda m, b, device: ((m(b[0].to(device)) - b[1].to(device)) ** 2).sum())
    out = cfg.run_dir() / STAGE
    out.mkdir(parents=True, exist_ok=True)

    def record(trainer: Trainer) -> None:
        time.sleep(STEP_PAUSE_S)
        if trainer.env.is_main:
            with (out / STEPS_FILE).open("a") as f:
                f.write(json.dumps({"step": trainer.step, "world": trainer.env.world_size,
                                    "accum": trainer.grad_accum, "loss": trainer.losses[-1], "t": time.time()}) + "\n")
        while trainer.step >= _hold_at(out) and not trainer.stop_requested:
            time.sleep(0.05)

    result = Trainer(task, cfg, env, out, hooks=[record]).train()
    if result.exit_code == OK and env.is_main:
        torch.save(model.state_dict(), out / FINAL_FILE)
    return result.exit_code


if __name__ == "__main__":
    exit_process(run_main(STAGE, run))
