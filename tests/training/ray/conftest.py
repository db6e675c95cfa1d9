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
