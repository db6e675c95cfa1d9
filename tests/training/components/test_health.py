"""The pre-flight health check's CPU path: passes on a healthy machine, fails on each kind of fault."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.support.ci_skips import hardware_reason
from contract.paths import child_env
from contract import exit_codes
from training.components import health

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason=hardware_reason("the CPU path runs only without CUDA"))


def _run(capsys, *argv: str) -> tuple[int, dict]:
    code = health.main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1])


def _checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.slow  # the command in a process of its own: torch imported
@needs_no_cuda
def test_the_command_passes_on_cpu_and_prints_one_json_line_last():
    env = child_env()
    env.pop(health.TEST_FAULT_ENV, None)
    env.pop(health.EXPECTED_GPUS_ENV, None)
    out = subprocess.run([sys.executable, "-m", "training.components.health", "--matmul-size", "128"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == exit_codes.OK, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["ok"] is True and report["device"] == "cpu" and report["gpus_visible"] == 0
    assert [c["name"] for c in report["checks"]] == ["gpus_visible", "matmul:cpu"]
    assert "128x128 exact" in _checks(report)["matmul:cpu"]["detail"]
    assert "ok   matmul:cpu" in out.stderr


@needs_no_cuda
def test_a_corrupted_product_fails_the_check(capsys, monkeypatch):
    monkeypatch.setenv(health.TEST_FAULT_ENV, "matmul")
    code, report = _run(capsys, "--matmul-size", "64")
    assert code == exit_codes.HEALTH_CHECK_FAILED
    assert report["ok"] is False
    matmul = _checks(report)["matmul:cpu"]
    assert not matmul["ok"] and matmul["detail"] == "1 of 4096 elements of a 64x64 product are wrong"
    assert _checks(report)["gpus_visible"]["ok"]  # the other checks still ran and passed


@needs_no_cuda
def test_requested_gpus_that_are_not_visible_fail_the_check(capsys, monkeypatch):
    monkeypatch.setenv(health.EXPECTED_GPUS_ENV, "2")  # what the worker Job sets from its GPU request
    code, report = _run(capsys, "--matmul-size", "32")
    assert code == exit_codes.HEALTH_CHECK_FAILED
    visible = _checks(report)["gpus_visible"]
    assert not visible["ok"] and visible["detail"] == "0 visible, 2 requested"
    assert report["gpus_expected"] == 2


def test_a_product_slower_than_the_time_limit_fails():
    result = health.check_matmul("cpu", 64, time_limit_s=1e-9)
    assert not result.ok and "limit 1e-09s" in result.detail


def test_the_exact_reference_is_exact():
    """Integer-valued operands: float32 holds every partial sum, so the product equals the int64 one."""
    a, b, want = health._operands(96)
    assert torch.equal((a.long() @ b.long()).double(), want)
    assert torch.equal((a @ b).double(), want)


@pytest.mark.parametrize("bad", ["abc", "-1"])
def test_bad_expected_gpus_is_bad_input_without_traceback(capsys, monkeypatch, bad):
    monkeypatch.setenv(health.EXPECTED_GPUS_ENV, bad)
    assert health.main([]) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert health.EXPECTED_GPUS_ENV in err and "Traceback" not in err


def test_an_unknown_test_fault_is_bad_input(capsys, monkeypatch):
    monkeypatch.setenv(health.TEST_FAULT_ENV, "gpu-on-fire")
    assert health.main([]) == exit_codes.BAD_INPUT
    assert "matmul, allreduce" in capsys.readouterr().err


@pytest.mark.slow
def test_the_allreduce_check_passes_over_gloo_and_fails_on_a_wrong_contribution(monkeypatch):
    """The collective code the NCCL path runs, here over gloo between two CPU processes."""
    monkeypatch.delenv(health.TEST_FAULT_ENV, raising=False)
    good = health.check_allreduce("gloo", 2, time_limit_s=240)
    assert good.ok, good.detail
    monkeypatch.setenv(health.TEST_FAULT_ENV, "allreduce")
    bad = health.check_allreduce("gloo", 2, time_limit_s=240)
    assert not bad.ok
    assert "all-reduce sum 1003, expected 3" in bad.detail
