"""Run spec validation: every field, clear errors naming it, bounded payload."""

from __future__ import annotations

import json

import pytest
import yaml

from training.config.run import load_run_config
from training.config.sections import STAGES
from training.scheduler.spec import MAX_SPEC_BYTES, RunSpec, SpecError, parse_spec
from training.scheduler.spec_file import load_spec, parse_spec_text

ROOT = "/mnt/shared"
GOOD = {
    "run_id": "demo-001",
    "stages": ["retriever", "index", "generator", "evaluate"],
    "data": {"corpus": "datasets/demo/corpus.jsonl", "qa_train": "/mnt/shared/datasets/demo/qa_train.jsonl",
             "qa_eval": "datasets/./demo/qa_eval.jsonl"},
    "models": {"generator": "models/tiny-lm"},
    "hyperparameters": {"retriever": {"max_steps": 20, "optim.lr": 3.0e-5}, "generator": {"tiny.num_layers": 1}},
    "nodes": 2,
    "gpus_per_node": 4,
    "priority": "high",
    "max_attempts": 5,
    "timeout_seconds": 3600,
}


def test_valid_spec_normalises_paths_and_round_trips():
    spec = parse_spec(GOOD, shared_root=ROOT)
    assert spec.data == {"corpus": "datasets/demo/corpus.jsonl", "qa_train": "datasets/demo/qa_train.jsonl",
                         "qa_eval": "datasets/demo/qa_eval.jsonl"}
    assert spec.stages == STAGES and spec.nodes == 2 and spec.gpus_per_node == 4
    assert RunSpec.from_json(spec.to_json()) == spec
    assert RunSpec.from_validated_json(spec.to_json()) == spec  # a gang's follower pods rebuild it unchecked
    ray = parse_spec({"run_id": "r", "stages": ["retriever"], "executor": "ray"}, shared_root=ROOT)
    assert RunSpec.from_validated_json(ray.to_json()) == ray and ray.executor == "ray"
    assert parse_spec_text(json.dumps(GOOD), shared_root=ROOT) == spec
    assert parse_spec_text(yaml.safe_dump(GOOD), shared_root=ROOT) == spec


def test_training_config_is_what_the_training_package_reads():
    cfg = load_run_config(parse_spec(GOOD, shared_root=ROOT).to_training_config("/tmp/shared"))
    assert cfg.run_id == "demo-001" and cfg.shared_root == "/tmp/shared"
    assert cfg.retriever.max_steps == 20 and cfg.retriever.optim.lr == pytest.approx(3e-5)
    assert cfg.generator.tiny.num_layers == 1 and cfg.generator.model == "/tmp/shared/models/tiny-lm"
    assert cfg.data.qa_train == "datasets/demo/qa_train.jsonl"


def test_run_section_sets_run_wide_keys_but_not_the_specs_own():
    spec = parse_spec(_with(hyperparameters={"run": {"seed": 7, "checkpoint.every_steps": 5, "metrics.port": 0}}),
                      shared_root=ROOT)
    cfg = load_run_config(spec.to_training_config(ROOT))
    assert cfg.seed == 7 and cfg.checkpoint.every_steps == 5 and cfg.metrics.port == 0
    for key in ("run_id", "shared_root", "stages", "data.corpus"):
        with pytest.raises(SpecError) as info:
            parse_spec(_with(hyperparameters={"run": {key: "x"}}), shared_root=ROOT)
        assert f"hyperparameters.run.{key}" in dict(info.value.problems)
    with pytest.raises(SpecError) as info:
        parse_spec(_with(hyperparameters={"run": {"seed": "abc"}}), shared_root=ROOT)
    assert "hyperparameters.run.seed" in dict(info.value.problems)


def test_defaults():
    spec = parse_spec({"run_id": "r1", "stages": ["index"]}, shared_root=ROOT)
    assert (spec.priority, spec.max_attempts, spec.nodes, spec.gpus_per_node) == ("normal", 3, 1, None)
    # parse_spec's defaults are RunSpec's, field by field: a spec that leaves them out is the dataclass's own.
    assert spec == RunSpec(run_id="r1", stages=("index",))


def _with(**changes):
    raw = {k: v for k, v in GOOD.items()}
    for key, value in changes.items():
        if value is ...:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("raw, field, fragment", [
    (_with(run_id="Demo_1"), "run_id", "DNS label"),
    (_with(run_id="-x"), "run_id", "DNS label"),
    (_with(run_id="a" * 64), "run_id", "DNS label"),
    (_with(run_id=...), "run_id", "DNS label"),
    (_with(stages=[]), "stages", "non-empty"),
    (_with(stages=["retriever", "train.py"]), "stages", "never a script path"),
    (_with(stages=["/mnt/shared/evil.sh"]), "stages", "unknown stage"),
    (_with(stages=["index", "index"]), "stages", "twice"),
    (_with(stages=["evaluate", "retriever"]), "stages", "pipeline order"),
    (_with(script_path="train.py"), "script_path", "script paths are not accepted"),
    (_with(data={"corpus": "../etc/passwd"}), "data.corpus", "'..'"),
    (_with(data={"corpus": "/etc/passwd"}), "data.corpus", "outside the shared root"),
    (_with(data={"corpus": "/mnt/sharedx/a"}), "data.corpus", "outside the shared root"),
    (_with(data={"corpus": "a/../../b"}), "data.corpus", "'..'"),
    (_with(data={"corpus": ""}), "data.corpus", "non-empty"),
    (_with(data={"Corpus": "a"}), "data.Corpus", "name must match"),
    (_with(data={"corpus_extra": "a"}), "data.corpus_extra", "unknown key"),
    (_with(data=["a"]), "data", "mapping"),
    (_with(models={"generator": "/root/model"}), "models.generator", "outside the shared root"),
    (_with(models={"critic": "models/x"}), "models.critic", "unknown model slot"),
    (_with(hyperparameters={"retriever": {"optim.lr": float("nan")}}), "hyperparameters.retriever.optim.lr", "finite"),
    (_with(hyperparameters={"retriever": {"Bad-Key": 1}}), "hyperparameters.retriever.Bad-Key", "lower_snake_case"),
    (_with(hyperparameters={"trainer": {"lr": 1}}), "hyperparameters.trainer", "unknown stage"),
    (_with(stages=["index"], hyperparameters={"retriever": {"max_steps": 1}}), "hyperparameters.retriever",
     "not in this run's stages"),
    (_with(hyperparameters={"retriever": {"max_stepz": 5}}), "hyperparameters.retriever.max_stepz", "unknown key"),
    (_with(hyperparameters={"retriever": {"max_steps": 0}}), "hyperparameters.retriever.max_steps", ">= 1"),
    (_with(hyperparameters={"retriever": {"max_steps": {"a": 1}}}), "hyperparameters.retriever.max_steps", "finite"),
    (_with(nodes=0), "nodes", "[1, 64]"),
    (_with(nodes="2"), "nodes", "integer"),
    (_with(nodes=True), "nodes", "integer"),
    (_with(gpus_per_node=17), "gpus_per_node", "[1, 16]"),
    (_with(priority="urgent"), "priority", "high, normal, low"),
    (_with(max_attempts=0), "max_attempts", "[1, 100]"),
    (_with(timeout_seconds=10**9), "timeout_seconds", "[1, 604800]"),
])
def test_bad_field_is_named(raw, field, fragment):
    with pytest.raises(SpecError) as info:
        parse_spec(raw, shared_root=ROOT)
    fields = [name for name, _ in info.value.problems]
    assert field in fields, info.value.problems
    message = dict(info.value.problems)[field]
    assert fragment in message, message
    assert "nothing was submitted" in str(info.value)


def test_all_problems_reported_at_once():
    with pytest.raises(SpecError) as info:
        parse_spec(_with(run_id="BAD", priority="x", nodes=0), shared_root=ROOT)
    assert {"run_id", "priority", "nodes"} <= {f for f, _ in info.value.problems}


def test_payload_and_file_size_are_bounded(tmp_path):
    big = _with(hyperparameters={"retriever": {f"k{i}": "x" * 1000 for i in range(70)}})
    with pytest.raises(SpecError, match="limit is"):
        parse_spec(big, shared_root=ROOT)
    path = tmp_path / "huge.yaml"
    path.write_text("run_id: a\n" + "#" * (MAX_SPEC_BYTES + 1))
    with pytest.raises(SpecError, match="limit is"):
        load_spec(path, shared_root=ROOT)


def test_local_demo_spec_is_valid_and_matches_the_demo_config(tmp_path):
    from training.demo.direct import demo_config
    from training.demo.through_queue import demo_spec

    spec = parse_spec(demo_spec("demo", 2, tmp_path), shared_root=str(tmp_path))
    via_queue = load_run_config(spec.to_training_config(str(tmp_path)))
    direct = load_run_config(demo_config(tmp_path, "demo"))
    assert via_queue == direct, "the queued demo must train exactly what python -m training.demo trains"
    assert spec.gpus_per_node == 2


# -- hostile input (issue 13): paths through hyper-parameters, identifiers, YAML, bytes --------

@pytest.mark.parametrize("key", ["retriever.model", "generator.model", "generator.tokenizer"])
@pytest.mark.parametrize("value, fragment", [
    ("/etc", "outside the shared root"),
    ("/mnt/sharedx/m", "outside the shared root"),
    ("../../root/.ssh", "'..'"),
    ("models/../../x", "'..'"),
    ("models/a\nb", "control characters"),
    (7, "non-empty path"),
])
def test_model_paths_set_through_hyperparameters_are_confined(key, value, fragment):
    section, name = key.split(".")
    with pytest.raises(SpecError) as info:
        parse_spec(_with(stages=["retriever", "generator"], hyperparameters={section: {name: value}}),
                   shared_root=ROOT)
    problems = dict(info.value.problems)
    assert fragment in problems[f"hyperparameters.{key}"], problems


def test_model_paths_through_hyperparameters_are_stored_relative_and_read_under_the_root():
    spec = parse_spec(_with(stages=["retriever", "generator"], models={},
                            hyperparameters={"retriever": {"model": "/mnt/shared/models/enc"},
                                             "generator": {"model": "", "tokenizer": "models/./tok"}}),
                      shared_root=ROOT)
    assert spec.hyperparameters["retriever"]["model"] == "models/enc"
    assert spec.hyperparameters["generator"] == {"model": "", "tokenizer": "models/tok"}
    cfg = load_run_config(spec.to_training_config("/data/shared"))
    assert cfg.retriever.model == "/data/shared/models/enc" and cfg.generator.tokenizer == "/data/shared/models/tok"
    assert cfg.generator.model == "", "empty = the packaged default model, not a path"
    assert RunSpec.from_json(spec.to_json()) == spec


def test_a_stage_key_cannot_hide_in_the_run_section_or_be_set_twice():
    with pytest.raises(SpecError) as info:
        parse_spec(_with(hyperparameters={"run": {"generator.model": "/etc", "retriever.max_steps": 1}}),
                   shared_root=ROOT)
    problems = dict(info.value.problems)
    assert "hyperparameters.generator" in problems["hyperparameters.run.generator.model"]
    assert "hyperparameters.run.retriever.max_steps" in problems
    with pytest.raises(SpecError) as info:
        parse_spec(_with(hyperparameters={"generator": {"model": "models/other"}}), shared_root=ROOT)
    assert "set it in one place" in dict(info.value.problems)["models.generator"]


def test_run_config_errors_map_to_the_spec_field_from_the_structured_key():
    cases = {
        "hyperparameters.retriever.optim.lr": _with(hyperparameters={"retriever": {"optim.lr": -1.0}}),
        "hyperparameters.evaluate.recall_at": _with(hyperparameters={"evaluate": {"recall_at": [0]}}),
        "hyperparameters.evaluate.recall_at[1]": _with(hyperparameters={"evaluate": {"recall_at": [1, "x"]}}),
        "hyperparameters.run.checkpoint.keep_latest_k": _with(hyperparameters={"run": {"checkpoint.keep_latest_k": 0}}),
        "hyperparameters.run.ray.retriever.pool": _with(hyperparameters={"run": {"ray.retriever.pool": "Bad_Pool"}}),
    }
    for field, raw in cases.items():
        with pytest.raises(SpecError) as info:
            parse_spec(raw, shared_root=ROOT)
        assert [f for f, _ in info.value.problems] == [field]


def test_identifiers_with_a_trailing_newline_are_refused():
    for text in ("run_id: |\n  exp1\nstages: [retriever]\n", '{"run_id": "exp1\\n", "stages": ["retriever"]}'):
        with pytest.raises(SpecError) as info:
            parse_spec_text(text, shared_root=ROOT)
        assert '"exp1\\n"' in dict(info.value.problems)["run_id"]
    with pytest.raises(SpecError) as info:
        parse_spec(_with(hyperparameters={"run": {"ray.retriever.pool": "gpu\n"}}), shared_root=ROOT)
    assert "hyperparameters.run.ray.retriever.pool" in dict(info.value.problems)


def test_messages_show_bounded_values():
    huge = "x" * 100_000
    raw = _with(run_id=huge, stages=[huge], priority=huge, nodes=[huge], data={"corpus": huge},
                hyperparameters={"retriever": {"max_steps": [huge[:1000]] * 200, huge: 1}})
    raw[huge] = 1
    with pytest.raises(SpecError) as info:
        parse_spec(raw, shared_root=ROOT)
    assert len(info.value.problems) >= 7
    assert all(len(field) <= 120 and len(message) <= 400 for field, message in info.value.problems), info.value
    with pytest.raises(SpecError) as info:
        parse_spec(_with(hyperparameters={"retriever": {"max_steps": 10**40, "temperature": 10**300}}),
                   shared_root=ROOT)
    assert "hyperparameters.retriever.max_steps" in dict(info.value.problems)


# -- a URL is not a path (issue 25) -------------------------------------------------------------

def _path_fields() -> dict[str, dict]:
    """Every path field of a spec -> a spec that sets it to ``{url}``: each data key, each model
    slot, each model/tokenizer key of the hyper-parameters."""
    import dataclasses

    from training.config.sections import MODEL_PATH_KEYS, DataConfig
    from training.scheduler.spec import MODEL_FIELDS

    both = ["retriever", "generator"]
    fields = {f"data.{f.name}": {"data": {f.name: "{url}"}} for f in dataclasses.fields(DataConfig)}
    fields |= {f"models.{slot}": {"stages": both, "models": {slot: "{url}"}} for slot in MODEL_FIELDS}
    for key in MODEL_PATH_KEYS:
        section, name = key.split(".")
        fields[f"hyperparameters.{key}"] = {"stages": both, "models": {}, "hyperparameters": {section: {name: "{url}"}}}
    return fields


PATH_FIELDS = _path_fields()
URLS = ["file:///etc/passwd", "s3://bucket/corpus.jsonl", "https://example.com/c.jsonl", "hf:org/model",
        "S3:bucket", "./s3://bucket/x", "/mnt/shared/file:/x", "c:/data"]


def _fill(value, url: str):
    if isinstance(value, dict):
        return {k: _fill(v, url) for k, v in value.items()}
    return url if value == "{url}" else value


@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
@pytest.mark.parametrize("url", URLS)
def test_a_url_is_refused_in_every_path_field(field, url):
    assert len(PATH_FIELDS) == 9  # 3 data keys, 3 model slots, 3 hyper-parameter model keys
    with pytest.raises(SpecError) as info:
        parse_spec(_with(**_fill(PATH_FIELDS[field], url)), shared_root=ROOT)
    problems = dict(info.value.problems)
    assert field in problems, info.value.problems
    assert "relative to the shared root" in problems[field] and "scheme" in problems[field], problems[field]


@pytest.mark.parametrize("path", ["datasets/v2:final/corpus.jsonl", "datasets/a.b+c-d/x", "2024:data/x"])
def test_a_colon_after_the_first_component_or_a_leading_digit_is_still_a_path(path):
    spec = parse_spec(_with(data={"corpus": path}), shared_root=ROOT)
    assert spec.data["corpus"] == path



def test_a_ray_run_declares_a_range_of_workers_per_training_stage():
    """``ray.<stage>.workers.min`` / ``.max`` (hyperparameters.run): accepted when every worker count keeps the
    global batch; a bad range or batch is refused naming the spec field; ``nodes: {min, max}`` points there."""
    run = {"ray.retriever.workers.min": 2, "ray.retriever.workers.max": 3}
    ok = {"run_id": "r", "stages": ["retriever"], "executor": "ray",
          "hyperparameters": {"retriever": {"global_batch_size": 6, "grad_accum": 2}, "run": run}}
    assert parse_spec(ok, shared_root=ROOT).hyperparameters["run"] == run
    cases = {
        "hyperparameters.run.ray.retriever.workers.min": {**ok, "hyperparameters": {
            **ok["hyperparameters"], "run": {**run, "ray.retriever.workers.min": 4}}},
        "hyperparameters.retriever.global_batch_size": {**ok, "hyperparameters": {
            "retriever": {"global_batch_size": 6}, "run": run}},
    }
    for field, raw in cases.items():
        with pytest.raises(SpecError) as info:
            parse_spec(raw, shared_root=ROOT)
        assert [f for f, _ in info.value.problems] == [field], info.value.problems
    with pytest.raises(SpecError) as info:
        parse_spec({**ok, "nodes": {"min": 2, "max": 3}}, shared_root=ROOT)
    assert "ray.<stage>.workers.min and .max" in dict(info.value.problems)["nodes"]
