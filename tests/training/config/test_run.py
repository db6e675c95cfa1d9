"""training.config.run (with the sections it reads): YAML + overrides, typed fields, clear errors, path confinement."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing

import pytest

from training.config.run import RunConfig, describe_fields, load_run_config, nest, parse_overrides, split_cli
from training.config.sections import STAGES, ConfigError
from training.scheduler.spec import SpecError
from training.scheduler.spec_file import load_spec


def test_defaults_are_valid_and_stages_ordered() -> None:
    cfg = load_run_config({})
    assert cfg.stages == STAGES == ("retriever", "index", "generator", "evaluate")
    assert cfg.shared_root == "/mnt/shared"
    assert str(cfg.stage_dir("index")) == "/mnt/shared/runs/local/index"


def test_yaml_file_then_overrides_win(tmp_path) -> None:
    f = tmp_path / "run.yaml"
    f.write_text("run_id: exp1\nretriever:\n  max_steps: 5\n  optim: {lr: 0.001}\nstages: [evaluate, retriever]\n")
    cfg = load_run_config(f, ["--retriever.optim.lr=1e-4", "--shared_root=/tmp/x", "--evaluate.recall_at=1,3",
                              "--checkpoint.async_save=false", "--generator.tiny.arch=gpt2"])
    assert cfg.run_id == "exp1"
    assert cfg.retriever.max_steps == 5
    assert cfg.retriever.optim.lr == pytest.approx(1e-4)  # YAML 1.1 would read "1e-4" as a string
    assert cfg.shared_root == "/tmp/x"
    assert cfg.evaluate.recall_at == (1, 3)
    assert cfg.checkpoint.async_save is False
    assert cfg.generator.tiny.arch == "gpt2"
    assert cfg.stages == ("retriever", "evaluate")  # canonical order


def test_round_trip_through_to_dict() -> None:
    cfg = load_run_config({"run_id": "a-b-c1", "retriever": {"temperature": 0.1}})
    assert load_run_config(cfg.to_dict()) == cfg


@pytest.mark.parametrize(("source", "overrides", "needle"), [
    ({"bogus": 1}, [], "bogus=1: unknown key"),
    ({"retriever": {"lr": 1}}, [], "retriever.lr=1: unknown key"),
    ({}, ["--retriever.optim.lrr=3"], "retriever.optim.lrr=\"3\": unknown key"),
    ({"retriever": {"max_steps": "ten"}}, [], "retriever.max_steps=\"ten\": must be an integer"),
    ({}, ["--retriever.optim.lr=-1"], "retriever.optim.lr=-1.0: must be > 0"),
    ({"stages": ["retriever", "train"]}, [], "stages[1]=\"train\": must be one of retriever, index, generator, evaluate"),
    ({}, ["--device=gpu"], "device=\"gpu\": must be one of auto, cpu, cuda"),
    ({"generator": {"tiny": {"arch": "bert"}}}, [], "generator.tiny.arch=\"bert\": must be one of llama, gpt2"),
    ({"stages": []}, [], "stages=[]: must list at least one"),
    ({"data": {"corpus": "../etc/passwd"}}, [], "data.corpus=\"../etc/passwd\": must not contain '..'"),
    ({"data": {"qa_train": "/etc/passwd"}}, [], "data.qa_train=\"/etc/passwd\": must be relative"),
    ({"run_id": "Bad Id!"}, [], "run_id=\"Bad Id!\""),
    ({"index": {"kind": "annoy"}}, [], "index.kind=\"annoy\": must be one of flat, ivf, hnsw"),
    ({"retriever": {"global_batch_size": 10, "grad_accum": 3}}, [], "must be divisible by grad_accum=3"),
    ({"checkpoint": {"async_save": "maybe"}}, [], "checkpoint.async_save=\"maybe\": must be a boolean"),
    ({"retriever": []}, [], "retriever=[]: must be a mapping"),
    ({}, ["--seed"], "override must look like --key=value"),
    ({}, ["--distributed.grad_compression=fp8"], "distributed.grad_compression=\"fp8\": must be one of none, bf16"),
    ({"distributed": {"bucket_cap_mb": 0}}, [], "distributed.bucket_cap_mb=0: must be in [1, 1024]"),
    ({}, ["--distributed.sparse_embedding_grads=on"],
     "distributed.sparse_embedding_grads=\"on\": must be one of auto, always, never"),
])
def test_bad_values_name_key_and_value(source, overrides, needle) -> None:
    with pytest.raises(ConfigError) as err:
        load_run_config(source, overrides)
    assert needle in str(err.value)


def _literal_fields(cls: type = RunConfig, prefix: str = "") -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            out.update(_literal_fields(tp, f"{prefix}{name}."))
        elif typing.get_origin(tp) is typing.Literal:
            out[prefix + name] = typing.get_args(tp)
        elif typing.get_origin(tp) is tuple and typing.get_origin(typing.get_args(tp)[0]) is typing.Literal:
            out[prefix + name + "[0]"] = typing.get_args(typing.get_args(tp)[0])
    return out


def test_choice_fields_are_literals_checked_by_the_loader() -> None:
    fields = _literal_fields()
    assert {"stages[0]", "device", "index.kind", "generator.tiny.arch", "distributed.grad_compression",
            "distributed.sparse_embedding_grads"} <= set(fields)
    for key, allowed in fields.items():
        dotted = key.removesuffix("[0]")
        for value in allowed:  # every allowed value loads, from YAML and from an override
            as_yaml = [value] if key.endswith("[0]") else value
            assert load_run_config(nest({dotted: as_yaml})) is not None
            assert load_run_config({}, [f"--{dotted}={value}"]) is not None
        for bad in ("bogus", 3, None):
            as_yaml = [bad] if key.endswith("[0]") else bad
            with pytest.raises(ConfigError) as err:
                load_run_config(nest({dotted: as_yaml}))
            assert f"{key}={json.dumps(bad)}: must be one of {', '.join(allowed)}" in str(err.value), key


@pytest.mark.parametrize(("load", "error"), [(load_run_config, ConfigError), (load_spec, SpecError)],
                         ids=["run-config", "run-spec"])
@pytest.mark.parametrize(("name", "text", "problem"), [
    ("missing.yaml", None, "cannot read"),
    ("bad.yaml", "run_id: [unclosed\n", "invalid YAML"),
    ("list.yaml", "- a\n- b\n", "must be a mapping"),
])
def test_bad_files_are_refused_naming_the_file(tmp_path, load, error, name, text, problem) -> None:
    """The run config and the run spec (which embeds it) refuse the same bad files, each naming the file."""
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(error, match=rf"(?s){re.escape(name)}.*{problem}"):
        load(path)


def test_cli_split_and_override_parsing() -> None:
    assert split_cli(["--config", "r.yaml", "--a.b=1"]) == ("r.yaml", ["--a.b=1"])
    assert split_cli(["--config=r.yaml"]) == ("r.yaml", [])
    assert parse_overrides(["--run-id=x", "seed=3"]) == [("run_id", "x"), ("seed", "3")]


def test_every_field_has_a_docstring() -> None:
    fields = describe_fields()
    assert len(fields) > 40
    missing = [k for k, doc in fields if not doc]
    assert missing == []


def test_every_section_is_a_dataclass_with_post_init() -> None:
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            assert "__post_init__" in vars(tp), tp


def test_config_import_does_not_import_torch() -> None:
    code = "import sys, training.config.run as c; c.load_run_config({}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_help_lists_every_key_and_exits_0(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        split_cli(["--config", "x.yaml", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "retriever.optim.lr" in out and "checkpoint.keep_latest_k" in out


def test_config_error_carries_the_dotted_key_and_a_bounded_value():
    cases = {
        "retriever.optim.lr": {"retriever": {"optim": {"lr": -1}}},
        "generator.tiny.hidden_size": {"generator": {"tiny": {"hidden_size": 130, "num_heads": 4}}},
        "index.nprobes": {"index": {"nprobes": 1}},
        "evaluate.recall_at[1]": {"evaluate": {"recall_at": [1, "x" * 10_000]}},
        "run_id": {"run_id": "exp1\n"},
        "retriever.optim.weight_decay": {"retriever": {"optim": {"weight_decay": 10**400}}},
    }
    for key, tree in cases.items():
        with pytest.raises(ConfigError) as err:
            load_run_config(tree)
        assert err.value.key == key and str(err.value).startswith(key) and len(str(err.value)) < 400, err.value


def test_tune_metric_is_a_full_match():
    assert load_run_config({"ray": {"tune": {"metric": "recall@5"}}}).ray.tune.metric == "recall@5"
    for bad in ("recall@5\n", "recall@\u0665", "mrr\n", "recall@", "recall@5x"):
        with pytest.raises(ConfigError) as err:
            load_run_config({"ray": {"tune": {"metric": bad}}})
        assert err.value.key == "ray.tune.metric", bad


@pytest.mark.parametrize("workers, key, needle", [
    ({"min": 0, "max": 3}, "ray.retriever.workers.min", "must be >= 1"),
    ({"min": 4, "max": 3}, "ray.retriever.workers.min", "must be <= ray.retriever.workers.max (3)"),
    ({"min": 2}, "ray.retriever.workers", "missing max"),
    ({"min": "two", "max": 3}, "ray.retriever.workers.min", "must be an integer"),
    ({"lo": 1, "max": 3}, "ray.retriever.workers", "unknown key(s) lo"),
])
def test_a_ray_worker_range_is_checked_naming_its_key(workers, key, needle) -> None:
    with pytest.raises(ConfigError) as err:
        load_run_config({"ray": {"retriever": {"workers": workers}}})
    assert err.value.key == key and needle in str(err.value), str(err.value)


def test_a_ray_worker_range_loads_round_trips_and_keeps_the_batch_at_every_size() -> None:
    cfg = load_run_config({"retriever": {"global_batch_size": 6, "grad_accum": 2}},
                          ["--ray.retriever.workers.min=2", "--ray.retriever.workers.max=3"])
    assert (cfg.ray.retriever.min_workers, cfg.ray.retriever.workers, cfg.ray.retriever.elastic) == (2, 3, True)
    assert load_run_config(cfg.to_dict()).ray == cfg.ray
    assert load_run_config({"ray": {"retriever": {"workers": {"min": 2, "max": 2}}}}).ray.retriever.min_workers == 0
    # 6 at 3 workers is 2 a rank: 2 workers cannot keep it; grad_accum 2 could (1 a rank and micro-step).
    with pytest.raises(ConfigError) as err:
        load_run_config({"retriever": {"global_batch_size": 6}, "ray": {"retriever": {"workers": {"min": 2, "max": 3}}}})
    assert err.value.key == "retriever.global_batch_size" and "grad_accum=2 keeps it" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_run_config({"ray": {"index": {"workers": {"min": 1, "max": 3}}}})
    assert err.value.key == "ray.index.workers" and "Ray Train stages" in str(err.value)

