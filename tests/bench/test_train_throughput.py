"""bench/train_throughput.py: the GPU generator mode runs end to end and refuses to fake a GPU figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ci_skips import hardware_reason

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "train_throughput.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"})


@pytest.mark.e2e  # the benchmark end to end
def test_gpu_generator_path_reports_mfu_against_989_tflops() -> None:
    out = _run("--gpu-generator", "--gen-device", "cpu", "--gen-shape", "tiny", "--gen-batch", "2",
               "--gen-seq", "32", "--quick")
    assert out.returncode == 0, out.stderr[-2000:]
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    assert fig["gen_dtype"] == "bf16" and fig["gen_shape"] == "tiny" and fig["peak_flops"] == 989e12
    assert fig["gen_flops"] == pytest.approx(6 * fig["gen_params"] * fig["gen_tokens_per_s"])
    assert fig["mfu"] == pytest.approx(fig["gen_flops"] / 989e12)


def test_1b_shape_is_about_one_billion_parameters() -> None:
    from bench.train_throughput import GEN_SHAPES
    from transformers import AutoModelForCausalLM, LlamaConfig

    import torch

    with torch.device("meta"):  # shapes only, no 4 GB allocation
        model = AutoModelForCausalLM.from_config(LlamaConfig(**GEN_SHAPES["1b"], tie_word_embeddings=True))
    n = sum(p.numel() for p in model.parameters())
    assert 0.9e9 < n < 1.3e9, n


@pytest.mark.e2e  # the benchmark's command, torch imported
def test_gpu_generator_without_cuda_refuses() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip(hardware_reason("this machine has CUDA: the refusal path does not apply"))
    out = _run("--gpu-generator", "--quick")
    assert out.returncode != 0 and "needs a CUDA device" in out.stderr


def test_median_ci90_brackets_the_median_and_narrows_with_more_data() -> None:
    from bench.train_throughput import median_ci90
    import random
    import statistics

    rng = random.Random(1)
    few = [rng.gauss(0.9, 0.05) for _ in range(12)]
    many = [rng.gauss(0.9, 0.05) for _ in range(400)]
    lo, hi = median_ci90(few)
    assert lo <= statistics.median(few) <= hi and lo < hi
    assert median_ci90(few) == [lo, hi]  # seeded: the same figures give the same interval
    lo_many, hi_many = median_ci90(many)
    assert hi_many - lo_many < (hi - lo) / 2
