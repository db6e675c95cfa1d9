"""training.components.loop: the step hooks (every step seen, none installed = nothing run per
step), the hooks variable, resume through the Trainer, the collector once its setup is done (heap.settle),
and no fault logic in production code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from training.components import loop
from training.components.distributed import DistEnv
from training.components.loop import HOOKS_ENV, Trainer, TrainTask, hooks_from_env, train
from training.config.run import load_run_config
from training.config.sections import OptimConfig

REPO = Path(__file__).resolve().parents[3]
ENV = DistEnv(0, 1, 0, 1, torch.device("cpu"))


def _task(max_steps: int = 5) -> TrainTask:
    torch.manual_seed(0)
    xs = torch.randn(16, 4)
    ys = xs @ torch.tensor([1.0, -2.0, 0.5, 3.0])

    def loss_sum(model: torch.nn.Module, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        return ((model(xs[idx]).squeeze(-1) - ys[idx]) ** 2).sum()

    return TrainTask(stage="retriever", model=torch.nn.Linear(4, 1), n_examples=16, global_batch_size=4,
                     grad_accum=2, max_steps=max_steps, optim=OptimConfig(lr=0.05, warmup_steps=0),
                     make_batch=torch.tensor,
                     count=len, loss_sum=loss_sum)


def _cfg(tmp_path: Path, **checkpoint: object):
    return load_run_config({"shared_root": str(tmp_path), "device": "cpu", "metrics": {"port": 0},
                            "checkpoint": {"every_steps": 2, **checkpoint}})


def test_a_hook_sees_every_step_with_its_loss(tmp_path: Path) -> None:
    seen: list[tuple[int, float]] = []
    result = train(_task(), _cfg(tmp_path), ENV, tmp_path / "stage",
                   hooks=[lambda t: seen.append((t.step, t.losses[-1]))])
    assert [s for s, _ in seen] == [1, 2, 3, 4, 5]
    assert [loss for _, loss in seen] == result.losses


def test_after_resume_hooks_see_only_the_steps_run(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    first = train(_task(max_steps=4), cfg, ENV, tmp_path / "stage", hooks=[])
    assert first.step == 4
    seen: list[int] = []
    again = train(_task(max_steps=6), cfg, ENV, tmp_path / "stage", hooks=[lambda t: seen.append(t.step)])
    assert again.resumed_from == 4 and seen == [5, 6]


def test_no_hook_runs_nothing_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOOKS_ENV, raising=False)
    trainer = Trainer(_task(), _cfg(tmp_path), ENV, tmp_path / "stage")
    assert trainer.hooks == []

    class Refuses(list):
        def __iter__(self):  # the loop must not even walk an empty hook list per step
            raise AssertionError("hooks iterated")

        def __bool__(self) -> bool:
            return False

    trainer.hooks = Refuses()
    assert trainer.train().step == 5


def test_the_trainer_freezes_the_start_once_its_setup_is_done(tmp_path: Path) -> None:
    import gc

    from training.components import heap

    heap.pause()  # as run_main does
    Trainer(_task(), _cfg(tmp_path), ENV, tmp_path / "stage")
    assert gc.isenabled() and gc.get_freeze_count() > 0


CALLS: list[int] = []


def step_hooks() -> list:
    """This module's hooks, as a module named in the hooks variable provides them."""
    return [lambda trainer: CALLS.append(trainer.step)]


def test_hooks_variable_imports_the_named_modules(tmp_path: Path) -> None:
    hooks = hooks_from_env({HOOKS_ENV: f" {__name__} , "})
    assert len(hooks) == 1
    CALLS.clear()
    train(_task(max_steps=3), _cfg(tmp_path), ENV, tmp_path / "stage", hooks=hooks)
    assert CALLS == [1, 2, 3]
    assert hooks_from_env({}) == []


@pytest.mark.parametrize("names, why", [("no_such_module_xyz", "cannot import 'no_such_module_xyz'"),
                                        ("json", "module 'json' has no step_hooks()")])
def test_hooks_variable_errors_name_the_module(names: str, why: str) -> None:
    with pytest.raises(RuntimeError, match=f"{HOOKS_ENV}=.*{why}"):
        hooks_from_env({HOOKS_ENV: names})


def test_production_code_has_no_fault_injection() -> None:
    from tests.support.faults import FAULT_ENVS

    for path in (REPO / "training").rglob("*.py"):
        text = path.read_text()
        for name in FAULT_ENVS:
            assert name not in text, f"{path.relative_to(REPO)} mentions {name}"
    for path in (REPO / "training" / "components").glob("*.py"):
        assert "SIGKILL" not in path.read_text(), f"{path.relative_to(REPO)} kills itself"


def test_fault_hooks_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support import faults

    for name in faults.FAULT_ENVS:
        monkeypatch.delenv(name, raising=False)
    assert faults.step_hooks() == []
    monkeypatch.setenv(faults.HANG_FAULT_ENV, "3")
    monkeypatch.setenv(HOOKS_ENV, faults.MODULE)
    assert len(hooks_from_env()) == 1
    assert loop.HOOKS_ENV == HOOKS_ENV


def test_a_fault_stage_confines_the_fault_to_that_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from tests.support import faults

    hanged: list[str] = []

    def trainer(stage: str) -> SimpleNamespace:  # stop already requested: the hang returns at once
        return SimpleNamespace(step=1, task=SimpleNamespace(stage=stage), stop_requested=True,
                               log=SimpleNamespace(warning=lambda *_: hanged.append(stage)))

    hook = faults.hang_after(1)
    monkeypatch.setenv(faults.FAULT_STAGE_ENV, "generator")
    hook(trainer("retriever"))
    hook(trainer("generator"))
    assert hanged == ["generator"]
    monkeypatch.delenv(faults.FAULT_STAGE_ENV)
    hook(trainer("retriever"))
    assert hanged == ["generator", "retriever"]


def test_an_elastic_run_accumulates_to_keep_the_global_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's node range: the micro-batch of the largest world (2 nodes x 1 rank x grad_accum 2 -> 1), and
    as many micro-steps as this world (1 rank) needs for the global batch of 4; what cannot be kept is exit 2."""
    from contract.env import ELASTIC_NODES_ENV
    from training.config.sections import ConfigError

    assert loop._batch_split(_task(), ENV) == (2, 2)  # fixed size: the config's grad_accum
    monkeypatch.setenv(ELASTIC_NODES_ENV, "1:2")
    assert loop._batch_split(_task(), ENV) == (1, 4)
    monkeypatch.setenv(ELASTIC_NODES_ENV, "1:3")  # 4 examples over 3 ranks x 2 micro-steps: no whole micro-batch
    with pytest.raises(ConfigError) as err:
        loop._batch_split(_task(), ENV)
    assert err.value.key == "retriever.global_batch_size" and "1:3" in str(err.value)
