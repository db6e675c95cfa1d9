"""``rearm_faulthandler`` (tests/training/ray/conftest.py): after ``ray.shutdown()`` a crash of the test process
prints its stack again. One pytest in a subprocess, one local Ray start in it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.training import REPO
from tests.training.ray.conftest import needs_ray

pytestmark = [pytest.mark.slow, pytest.mark.ray]
needs_ray()

CHILD = '''
import ctypes, os, signal, tempfile

import pytest

from tests.training.ray.conftest import ray_env, rearm_faulthandler


def sigsegv_handler() -> int:
    """The process's SIGSEGV handler address (0: SIG_DFL), from sigaction(2)."""
    old = ctypes.create_string_buffer(256)  # struct sigaction: the handler comes first
    assert ctypes.CDLL(None, use_errno=True).sigaction(signal.SIGSEGV, None, old) == 0
    return int.from_bytes(old.raw[:8], "little")


@pytest.fixture(scope="module")
def was_a_ray_driver(request):
    import ray

    ray_env()
    assert sigsegv_handler() != 0  # pytest's faulthandler
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rgf", dir="/tmp"))
    ray.shutdown()
    print("handler after ray.shutdown:", sigsegv_handler(), flush=True)
    if os.environ.get("REARM") == "1":
        rearm_faulthandler(request.config)


def test_crash(was_a_ray_driver):
    ctypes.string_at(0)
'''


def _crash(tmp_path, rearm: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_child_crash.py"
    test.write_text(CHILD)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "REARM": rearm, "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), "-c", "/dev/null", str(test)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)


def test_after_ray_shutdown_a_crash_prints_its_stack_only_once_rearmed(tmp_path) -> None:
    silent = _crash(tmp_path, rearm="0")
    # What Ray 2.58 leaves: SIGSEGV at SIG_DFL, the process dies with no stack.
    assert "handler after ray.shutdown: 0" in silent.stdout, silent.stdout[-2000:] + silent.stderr[-2000:]
    assert silent.returncode == -11 and "Fatal Python error" not in silent.stderr, silent.stderr[-2000:]
    shown = _crash(tmp_path, rearm="1")
    assert shown.returncode == -11, shown.stdout[-2000:] + shown.stderr[-2000:]
    assert "Fatal Python error: Segmentation fault" in shown.stderr and "test_child_crash.py" in shown.stderr, \
        shown.stderr[-3000:]
