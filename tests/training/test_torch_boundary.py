"""The scheduling plane and the torch-free contracts never import torch, transformers or faiss.

``ragpool submit`` validates specs on machines (laptops, CI, the CPU-only queue worker) that
have no torch; a heavy import sneaking into ``training/scheduler/`` or the contracts would
make every submit pay seconds of import time or fail outright. Each module is imported in a
fresh interpreter and the test fails if any forbidden package ends up in ``sys.modules``,
whether imported directly or through what the module imports.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import contract
import training
import training.config
import training.datasets
import training.scheduler

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "transformers", "faiss")
CONTRACTS = ("training", "training.worker")
"""Torch-free modules of training/ beside the packages walked below (the scheduler, the run config, the datasets'
import and export, which run in a small Job); every module of contract/ is torch-free too."""


def torch_free_modules() -> list[str]:
    """Every module of ``training.scheduler``, ``training.config``, ``training.datasets`` and ``contract`` (found on
    disk, so a new one is covered) plus training's other torch-free modules."""
    found = [m.name for m in pkgutil.walk_packages(training.scheduler.__path__, "training.scheduler.")]
    found += [m.name for m in pkgutil.walk_packages(training.config.__path__, "training.config.")]
    found += [m.name for m in pkgutil.walk_packages(training.datasets.__path__, "training.datasets.")]
    found += [m.name for m in pkgutil.walk_packages(contract.__path__, "contract.")]
    return sorted({"training.scheduler", "training.config", "training.datasets", "contract", *found, *CONTRACTS})


PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(json.dumps(heavy))
"""


def heavy_imports(*modules: str) -> list[str]:
    """The forbidden modules loaded after importing ``modules`` (in this order) in one fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(forbidden=set(FORBIDDEN)), *modules],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"importing {modules} failed:\n{out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_boundary_covers_every_scheduler_module() -> None:
    mods = torch_free_modules()
    root = Path(training.scheduler.__path__[0])
    on_disk = {".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.py")}
    on_disk = {m.removesuffix(".__init__") for m in on_disk if m != "__init__"}
    assert {m.removeprefix("training.scheduler.") for m in mods if m.startswith("training.scheduler.")} == on_disk


def violations(mods: list[str]) -> dict[str, list[str]]:
    """Module -> forbidden modules it loads. All of ``mods`` are imported in one interpreter first; only
    when that finds a heavy import is each probed alone (one interpreter each), to name the culprits."""
    if not heavy_imports(*mods):
        return {}
    return {m: found for m in mods if (found := heavy_imports(m))}


def test_no_torch_free_module_imports_torch() -> None:
    found = violations(torch_free_modules())
    assert found == {}, f"{sorted(found)} pull in {FORBIDDEN} (directly or through their imports)"


@pytest.mark.slow  # interpreters that import torch
def test_the_probe_detects_a_torch_import_and_names_the_module() -> None:
    """The check is not vacuous: a module that does import torch (a stage command) is caught among
    torch-free modules, and the failure names it and only it."""
    mods = [*torch_free_modules()[:3], "training.components.loop"]
    found = violations(mods)
    assert list(found) == ["training.components.loop"] and "torch" in found["training.components.loop"]
