"""contract.paths: the one run-id rule and the one confinement rule, as every caller sees them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from training.components.data import DataError, resolve_confined as data_resolve
from training.config.run import load_run_config
from training.config.sections import ConfigError
from contract.paths import PathError, confine, is_valid_run_id, resolve_confined
from training.scheduler.spec import SpecError, parse_spec

ROOT = "/mnt/shared"
RUN_IDS = ["exp1", "a", "demo-001", "a" * 63, "Exp1", "a_b", "a.b", "-x", "x-", "a" * 64, "exp1\n", "", "é1"]


@pytest.mark.parametrize("run_id", RUN_IDS)
def test_run_config_and_run_spec_accept_the_same_run_ids(run_id: str) -> None:
    def config_ok() -> bool:
        try:
            load_run_config({"run_id": run_id})
        except ConfigError:
            return False
        return True

    def spec_ok() -> bool:
        try:
            parse_spec({"run_id": run_id, "stages": ["retriever"]}, shared_root=ROOT)
        except SpecError:
            return False
        return True

    assert config_ok() == spec_ok() == is_valid_run_id(run_id)


def test_trailing_newline_is_not_a_run_id() -> None:
    assert is_valid_run_id("exp1") and not is_valid_run_id("exp1\n")


@pytest.mark.parametrize("value, expected", [
    ("datasets/a.jsonl", "datasets/a.jsonl"),
    ("datasets//a.jsonl", "datasets/a.jsonl"),
    ("./datasets/a.jsonl", "datasets/a.jsonl"),
    ("/mnt/shared/models/m", "models/m"),
])
def test_confine_normalises_paths_inside_the_root(value: str, expected: str) -> None:
    assert confine(value, root=ROOT) == expected


@pytest.mark.parametrize("value", [
    "", " ", "../etc/passwd", "a/../../b", "/etc/passwd", "/mnt/sharedX/a", "/mnt/shared", ".",
    "a\\b", "a\x00b", "a\nb", "x" * 1025, None, 3, ["a"],
])
def test_confine_refuses_escapes_and_junk(value: object) -> None:
    with pytest.raises(PathError):
        confine(value, root=ROOT)


def test_absolute_paths_need_a_root() -> None:
    with pytest.raises(PathError, match="not absolute"):
        confine("/mnt/shared/a")


def test_resolve_confined_refuses_a_symlink_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    os.symlink("/etc", root / "out")
    assert resolve_confined(root, "sub") == (root / "sub").resolve()
    with pytest.raises(PathError, match="symlink escape"):
        resolve_confined(root, "out/passwd")
    with pytest.raises(DataError, match="data.corpus"):
        data_resolve(root, "out/passwd", "data.corpus")


def test_child_env_puts_this_package_first_once_and_adds_extra():
    from contract.paths import PACKAGE_ROOT, child_env

    env = child_env({"PYTHONPATH": os.pathsep.join(["/elsewhere", ""]), "KEEP": "1"}, RAGPOOL_RUN_ID="r")
    assert env["PYTHONPATH"].split(os.pathsep) == [PACKAGE_ROOT, "/elsewhere"]
    assert env["KEEP"] == "1" and env["RAGPOOL_RUN_ID"] == "r"
    assert child_env(env)["PYTHONPATH"] == env["PYTHONPATH"], "already on it: unchanged"
    assert child_env({})["PYTHONPATH"] == PACKAGE_ROOT
    assert (Path(PACKAGE_ROOT) / "contract" / "paths.py").is_file() and (Path(PACKAGE_ROOT) / "training").is_dir()
