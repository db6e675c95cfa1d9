"""The ``parallelism`` section: bad input refused at submit (exit 2 naming the key, nothing enqueued),
and the model-side checks of :mod:`training.components.sharding` that need the model itself."""

from __future__ import annotations

import pytest
import torch

from training.config.run import load_run_config
from training.config.sections import ConfigError, ParallelismConfig
from training.scheduler import cli as runs_cli
from training.scheduler.spec import parse_spec
from tests.support.redis_fixtures import SPEC_DATA_YAML

BASE = "run_id: par\nstages: [retriever, index, generator]\n" + SPEC_DATA_YAML


@pytest.mark.parametrize("extra, key, fragment", [
    ("hyperparameters: {generator: {parallelism.strategy: tp}}", "hyperparameters.generator.parallelism.strategy",
     "must be one of ddp, fsdp, hsdp"),
    ("hyperparameters: {retriever: {parallelism.strategy: fsdp}}", "hyperparameters.retriever.parallelism.strategy",
     "must be one of ddp"),
    ("hyperparameters: {retriever: {parallelism.activation_checkpointing: true}}",
     "hyperparameters.retriever.parallelism.activation_checkpointing", "no decoder blocks to checkpoint"),
    ("hyperparameters: {generator: {parallelism.strategy: hsdp}}\nnodes: 1",
     "hyperparameters.generator.parallelism.strategy", "gives one node: use fsdp"),
    ("hyperparameters: {generator: {parallelism.strategy: hsdp}}\nexecutor: ray",
     "hyperparameters.generator.parallelism.strategy", "executor: ray places workers freely"),
])
def test_bad_parallelism_is_exit_2_naming_the_key(tmp_path, monkeypatch, capsys, extra, key, fragment) -> None:
    # An unreachable Redis: were the spec accepted, submit would fail with 4 (unavailable), never 2.
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    path = tmp_path / "run.yaml"
    path.write_text(BASE + extra + "\n")
    assert runs_cli.main(["submit", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{key}:" in err and fragment in err, err
    assert "Traceback" not in err


def test_control_a_good_spec_reaches_redis(tmp_path, monkeypatch) -> None:
    """The exit 2 above is the spec's refusal: the same submit of a good spec gets as far as Redis (4)."""
    from training.scheduler import redis_conn

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(redis_conn, "make_retry", lambda settings: redis_conn.no_retry())  # not ~7 s of backoff
    path = tmp_path / "run.yaml"
    path.write_text(BASE + "hyperparameters: {generator: {parallelism.strategy: fsdp}}\n")
    assert runs_cli.main(["submit", str(path)]) == 4


@pytest.mark.parametrize("raw", [
    {"hyperparameters": {"generator": {"parallelism.strategy": "hsdp"}}, "nodes": 2, "gpus_per_node": 8},
    {"hyperparameters": {"generator": {"parallelism.strategy": "fsdp"}}, "nodes": 1, "gpus_per_node": 1},
    {"hyperparameters": {"generator": {"parallelism.activation_checkpointing": True}}},
])
def test_good_parallelism_is_accepted(raw) -> None:
    """hsdp over 2 nodes; fsdp on one rank (allowed: it trains unsharded with a warning and writes DCP
    checkpoints, so it can resume at any world size); activation checkpointing under ddp."""
    parse_spec({"run_id": "ok", "stages": ["generator"], **raw}, shared_root="/mnt/shared")


def test_defaults_are_ddp() -> None:
    cfg = load_run_config({})
    assert cfg.retriever.parallelism.strategy == "ddp" and cfg.generator.parallelism.strategy == "ddp"
    assert not cfg.generator.parallelism.sharded and ParallelismConfig(strategy="fsdp").sharded


def test_decoder_blocks_of_the_tiny_models_and_none_elsewhere() -> None:
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer
    from training.components.sharding import decoder_blocks

    tok = load_generator_tokenizer()
    for arch, name in (("llama", "LlamaDecoderLayer"), ("gpt2", "GPT2Block")):
        blocks = decoder_blocks(build_tiny_causal_lm(tok, arch, 32, 3, 2, 64, 64, seed=1))
        assert [type(b).__name__ for b in blocks] == [name] * 3
    assert decoder_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []


def test_fsdp_or_checkpointing_without_blocks_is_a_config_error() -> None:
    from training.components.distributed import DistEnv
    from training.components.sharding import shard_model

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    for par, key in ((ParallelismConfig(strategy="fsdp"), "parallelism.strategy"),
                     (ParallelismConfig(activation_checkpointing=True), "parallelism.activation_checkpointing")):
        with pytest.raises(ConfigError) as err:
            shard_model(model, par, env, "generator")
        assert err.value.key == key and "no decoder blocks" in str(err.value)


def test_the_documented_spec_for_a_7b_generator_is_valid(monkeypatch) -> None:
    import re
    from pathlib import Path

    import yaml

    from contract.lanes import POOLS_ENV

    monkeypatch.delenv(POOLS_ENV, raising=False)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "TRAINING.md").read_text()
    section = doc.split("## Training a large generator", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "the docs/TRAINING.md section has no yaml spec"
    spec = parse_spec(yaml.safe_load(block.group(1)), shared_root="/mnt/shared")
    cfg = load_run_config(spec.to_training_config("/mnt/shared"))
    assert cfg.generator.parallelism.strategy == "fsdp" and cfg.generator.parallelism.activation_checkpointing


def _counting(forward, calls: dict, name: str):
    def counted(*args, **kwargs):
        calls[name] += 1
        return forward(*args, **kwargs)
    return counted


def test_activation_checkpointing_recomputes_each_block_with_the_same_gradients() -> None:
    from training.components.distributed import DistEnv
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer
    from training.components.sharding import decoder_blocks, shard_model

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    tok = load_generator_tokenizer()
    plain, ckpt = (build_tiny_causal_lm(tok, "llama", 32, 2, 2, 64, 64, seed=3) for _ in range(2))
    shard_model(ckpt, ParallelismConfig(activation_checkpointing=True), env, "generator")
    x = torch.randint(5, 300, (2, 16))
    calls = {"plain": 0, "ckpt": 0}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        model.train()
        for block in decoder_blocks(model):  # counted in forward itself: torch runs no module hooks in a recompute
            block.mlp.forward = _counting(block.mlp.forward, calls, name)
        model(input_ids=x, labels=x).loss.backward()
    assert calls == {"plain": 2, "ckpt": 4}, "each block runs again in backward only when checkpointed"
    for (name, p), (_, q) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_meta_build_then_load_equals_from_pretrained_on_one_rank(tmp_path) -> None:
    """One rank (fsdp unsharded): the meta-built model loads every tensor whole, equal to from_pretrained,
    buffers (rotary tables) included, tied weights still tied; a bf16 file loads into fp32 parameters."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.components.distributed import DistEnv
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer
    from training.components.sharding import load_safetensors_sharded, params_on_meta, shard_model

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    source = build_tiny_causal_lm(load_generator_tokenizer(), "llama", 32, 2, 2, 64, 64, seed=5)
    source.to(torch.bfloat16).save_pretrained(tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with params_on_meta():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    assert all(p.is_meta for p in model.parameters())
    model = shard_model(model, ParallelismConfig(strategy="fsdp"), env, "generator")
    load_safetensors_sharded(model, env.device, tmp_path)
    want, got = ref.state_dict(), model.state_dict()
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert model.lm_head.weight is model.model.embed_tokens.weight
