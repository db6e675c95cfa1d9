"""Ray test helpers: one Ray cluster per test module (a Ray start costs seconds and ~700 MB).
Modules that start Ray skip without the ray extra (``needs_ray``)."""

from __future__ import annotations

import os

import pytest

from training.paths import child_env



def ray_env() -> None:
    """Environment every Ray process of the tests inherits (set before the cluster starts)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["RAY_TRAIN_ENABLE_PRINT_PATCH"] = "0"
    os.environ.update(child_env())


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

    from training.ports import free_port

    ray_env()
    import ray

    temp = ray_temp_dir(None)
    # The dashboard serves the State API Ray Train's placement-group cleaner needs when Tune stops a trial.
    ray.init(address="local", num_cpus=2, include_dashboard=True, dashboard_port=free_port(), _temp_dir=temp, log_to_driver=False)
    yield ray
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
