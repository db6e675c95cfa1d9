"""Ray test helpers: one Ray cluster per test module (a Ray start costs seconds and ~700 MB).
Modules that start Ray skip without the ray extra (``needs_ray``)."""

from __future__ import annotations

import faulthandler
import os

import pytest

from training.localdev.ray_head import API_SERVER_ENV, METRICS_COLLECTION_ENV, PREEMPTION_WATCHER_ENV, USAGE_STATS_ENV
from contract.paths import child_env


def ray_env() -> None:
    """Environment every Ray process of the tests inherits (set before the cluster starts)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["RAY_TRAIN_ENABLE_PRINT_PATCH"] = "0"
    os.environ[PREEMPTION_WATCHER_ENV] = "0"  # as the local head sets it (training/localdev/ray_head.py)
    os.environ[USAGE_STATS_ENV] = os.environ[METRICS_COLLECTION_ENV] = "0"  # so does it
    os.environ.update(child_env())


def rearm_faulthandler(config: pytest.Config) -> None:
    """Install pytest's faulthandler again after ``ray.shutdown()``. Ray 2.58's shutdown of a driver
    (``RayLog::ShutDownRayLog`` -> ``UninstallSignalAction``) sets SIGSEGV and the other fatal signals back to
    SIG_DFL, so a later crash of this xdist worker would print no stack at all (one did: only the kernel log
    named ``_raylet.so``). ``enable()`` on an enabled faulthandler does nothing, hence ``disable()`` first; the
    file is pytest's own duplicate of stderr, outside output capturing."""
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    if faulthandler.is_enabled():
        faulthandler.disable()
        faulthandler.enable(file=config.stash.get(fault_handler_stderr_fd_key, 2))


@pytest.fixture(scope="module", autouse=True)
def _faulthandler_after_ray(request: pytest.FixtureRequest):
    """Every Ray test module re-arms the faulthandler at its end: an autouse fixture is torn down after the
    module's own fixtures, so after whichever of them called ``ray.shutdown()``."""
    yield
    rearm_faulthandler(request.config)


def ray_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Ray's socket paths must stay short (AF_UNIX limit): a short dir under /tmp.
    import tempfile

    return tempfile.mkdtemp(prefix="rgr", dir="/tmp")


def needs_ray() -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")


@pytest.fixture(scope="module")
def local_ray():
    """One in-process local Ray (2 CPUs) for the test module that asks for it (test_driver.py); stopped after."""
    import shutil

    from contract.ports import free_port

    ray_env()
    import ray

    temp = ray_temp_dir(None)
    # The dashboard serves the State API Ray Train's placement-group cleaner needs when Tune stops a trial; every
    # process of this cluster (the raylet starts them with this process's environment) asks this one
    # (API_SERVER_ENV), never another Ray on the machine.
    port = free_port()
    os.environ[API_SERVER_ENV] = f"http://127.0.0.1:{port}"
    ray.init(address="local", num_cpus=2, include_dashboard=True, dashboard_port=port, _temp_dir=temp, log_to_driver=False)
    yield ray
    ray.shutdown()
    os.environ.pop(API_SERVER_ENV, None)
    shutil.rmtree(temp, ignore_errors=True)
