"""tests/support/ci_skips.py: in CI a skip fails the run unless the machine's hardware is the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SAMPLE = '''
import shutil
import pytest
from tests.support.ci_skips import hardware_reason

def test_missing_binary():
    pytest.skip("frobnicate not on PATH")

@pytest.mark.skipif(True, reason="a file beside the repo is absent")
def test_missing_file():
    pass

def test_hardware():
    pytest.skip(hardware_reason("this machine has CUDA"))

@pytest.mark.xfail(reason="known", strict=False)
def test_known_failure():
    assert False

def test_passes():
    pass
'''


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.ci_skips", "-p", "no:cacheprovider", "-rA",
         "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_in_ci_a_skip_for_something_missing_fails_and_a_hardware_skip_does_not(tmp_path):
    out = _run(tmp_path, "true")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED test_sample.py::test_missing_binary" in out.stdout, out.stdout
    assert "ERROR test_sample.py::test_missing_file" in out.stdout, out.stdout  # skipif: a setup failure
    assert "skipped in CI (CI=true): frobnicate not on PATH" in out.stdout
    assert "skipped in CI (CI=true): a file beside the repo is absent" in out.stdout
    assert "SKIPPED [1] test_sample.py:14: hardware: this machine has CUDA" in out.stdout, out.stdout
    assert "XFAIL test_sample.py::test_known_failure" in out.stdout
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in out.stdout


def test_outside_ci_every_skip_stays_a_skip(tmp_path):
    out = _run(tmp_path, None)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed, 3 skipped, 1 xfailed" in out.stdout, out.stdout
