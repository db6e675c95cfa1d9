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

import training
import training.scheduler

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "transformers", "faiss")
CONTRACTS = ("training", "training.config", "training.exit_codes", "training.messages", "training.paths", "training.ports",
             "training.worker")


def torch_free_modules() -> list[str]:
    """Every module of ``training.scheduler`` (found on disk, so a new one is covered) plus the contracts."""
    found = [m.name for m in pkgutil.walk_packages(training.scheduler.__path__, "training.scheduler.")]
    return sorted({"training.scheduler", *found, *CONTRACTS})


PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(json.dumps(heavy))
"""


def heavy_imports(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(forbidden=set(FORBIDDEN)), module],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"importing {module} failed:\n{out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_boundary_covers_every_scheduler_module() -> None:
    mods = torch_free_modules()
    on_disk = {p.stem for p in Path(training.scheduler.__path__[0]).glob("*.py") if p.stem != "__init__"}
    assert {m.rsplit(".", 1)[1] for m in mods if m.startswith("training.scheduler.")} == on_disk


@pytest.mark.parametrize("module", torch_free_modules())
def test_module_does_not_import_torch(module: str) -> None:
    assert heavy_imports(module) == [], f"{module} pulls in {FORBIDDEN} (directly or through its imports)"


def test_the_probe_detects_a_torch_import() -> None:
    """The check is not vacuous: a module that does import torch (a stage command) is caught."""
    assert "torch" in heavy_imports("training.components.loop")
