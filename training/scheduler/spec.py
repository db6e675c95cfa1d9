"""Run spec: what an ML engineer submits with ``ragpool submit run.yaml``.

A run spec names *stages of the training package* (an allow-list, never a script
path), data and model paths *inside the shared root*, per-stage hyper-parameters,
the shape of the job and its queue policy. It is validated completely before
anything touches Redis; every problem is reported with the field it concerns, and
nothing is enqueued when there is one.

Example (YAML; JSON works too)::

    run_id: demo-001                 # DNS label: [a-z0-9-], <= 63 chars
    stages: [retriever, index, generator, evaluate]
    data:                            # relative to the shared root (/mnt/shared)
      corpus: datasets/demo/corpus.jsonl
      qa_train: datasets/demo/qa_train.jsonl
      qa_eval: datasets/demo/qa_eval.jsonl
    models:                          # optional: retriever, generator, tokenizer (shared-root paths)
      generator: models/tiny-lm
    hyperparameters:                 # per stage, training.config keys; dotted keys nest
      retriever: {max_steps: 200, global_batch_size: 32, optim.lr: 2.0e-5}
      generator: {optim.lr: 1.0e-4}
      run: {seed: 7, checkpoint.every_steps: 100}   # run-wide keys (not run_id/shared_root/stages/data)
    nodes: 1                         # > 1 runs as an Indexed Job with torchrun c10d rendezvous
    gpus_per_node: null              # processes per node; null = all GPUs of the pod (1 on CPU)
    priority: normal                 # high | normal | low
    max_attempts: 3                  # failures before the dead-letter list
    timeout_seconds: 86400           # per attempt

The training config the worker will write is also checked with
``training.config.load_run_config`` (torch-free) at submit time, so a wrong
hyper-parameter name or value is rejected before it reaches the queue.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from training.config import STAGES, ConfigError, deep_merge, load_run_config, nest
from training.paths import RUN_ID_RULE, PathError, confine, is_valid_run_id, shared_root_from_env

PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
"""Queue priorities, highest first."""

MAX_SPEC_BYTES = 64 * 1024
"""Upper bound on a spec file and on its stored JSON payload."""

_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_HYPER_KEY_RE = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*){0,3}")
# Spec ``models`` entries -> (section, key) of the training config they set.
MODEL_FIELDS: dict[str, tuple[str, str]] = {
    "retriever": ("retriever", "model"),
    "generator": ("generator", "model"),
    "tokenizer": ("generator", "tokenizer"),
}
RUN_SECTION = "run"
"""``hyperparameters.run``: run-wide training keys (seed, device, checkpoint.*, metrics.*)."""
_RUN_SECTION_FORBIDDEN = ("run_id", "shared_root", "stages", "data")
_TOP_LEVEL_FIELDS = (
    "run_id", "stages", "data", "models", "hyperparameters", "nodes", "gpus_per_node",
    "priority", "max_attempts", "timeout_seconds",
)


class SpecError(ValueError):
    """A run spec is invalid; ``problems`` lists ``(field, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "run spec") -> None:
        self.problems = problems
        self.source = source
        lines = "\n".join(f"  {name}: {message}" for name, message in problems)
        super().__init__(f"{source}: {len(problems)} problem(s); nothing was submitted\n{lines}")


@dataclass(frozen=True)
class RunSpec:
    """A validated run spec (build with :func:`parse_spec` / :func:`load_spec`)."""

    run_id: str
    """Unique run name, a DNS label; the queue task id and ``runs/<run_id>/`` directory."""
    stages: tuple[str, ...]
    """Stages to run, in pipeline order, from the training package's allow-list."""
    data: dict[str, str] = field(default_factory=dict)
    """Named dataset paths, relative to the shared root (normalised, no ``..``)."""
    models: dict[str, str] = field(default_factory=dict)
    """Named model paths, relative to the shared root."""
    hyperparameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-stage scalar hyper-parameters; keys may be dotted (``optim.lr``)."""
    nodes: int = 1
    """Number of pods (torchrun ``--nnodes``)."""
    gpus_per_node: int | None = None
    """Processes per pod (torchrun ``--nproc-per-node``); None = the pod's GPU count, 1 on CPU."""
    priority: str = "normal"
    """Queue priority: ``high``, ``normal`` or ``low``."""
    max_attempts: int = 3
    """Attempts (claims that fail) before the task goes to the dead-letter list."""
    timeout_seconds: int = 86400
    """Wall-clock limit of one attempt; the worker stops the run and counts a failure."""

    def to_payload(self) -> dict[str, Any]:
        """The JSON-able mapping stored in the queue (round-trips through ``parse_spec``)."""
        return {
            "run_id": self.run_id,
            "stages": list(self.stages),
            "data": dict(self.data),
            "models": dict(self.models),
            "hyperparameters": {k: dict(v) for k, v in self.hyperparameters.items()},
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
        }

    def to_training_config(self, shared_root: str) -> dict[str, Any]:
        """The mapping ``training.config.load_run_config`` reads (the worker writes it as run.yaml).

        Data paths stay relative to ``shared_root`` (the config confines them itself);
        model paths become absolute under it (the config takes a directory or a name).
        """
        config: dict[str, Any] = {"run_id": self.run_id, "shared_root": shared_root,
                                  "stages": list(self.stages)}
        if self.data:
            config["data"] = dict(self.data)
        for stage, params in self.hyperparameters.items():
            if stage == RUN_SECTION:
                config = deep_merge(config, nest(params))
            else:
                config[stage] = nest(params)
        for name, rel in self.models.items():
            section, key = MODEL_FIELDS[name]
            config.setdefault(section, {})[key] = posixpath.join(shared_root, rel)
        return config

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, compact): equal specs give equal strings."""
        return json.dumps(self.to_payload(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        return parse_spec(json.loads(text), source="stored spec")


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: messages never echo a huge value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int_field(raw: Mapping, name: str, default: int, lo: int, hi: int, problems: list) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((name, f"must be an integer in [{lo}, {hi}], got {value!r}"))
        return default
    if not lo <= value <= hi:
        problems.append((name, f"must be in [{lo}, {hi}], got {value}"))
        return default
    return value


def _confined_path(value: Any, name: str, shared_root: str, problems: list) -> str | None:
    """``value`` as a shared-root-relative path (:func:`training.paths.confine`), or record why not."""
    try:
        return confine(value, root=shared_root)
    except PathError as err:
        problems.append((name, f"{_shown(value)} {err}"))
        return None


def _path_map(raw: Mapping, name: str, shared_root: str, problems: list) -> dict[str, str]:
    value = raw.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append((name, f"must be a mapping of name -> path, got {type(value).__name__}"))
        return {}
    out: dict[str, str] = {}
    for key, path in value.items():
        if not isinstance(key, str) or not _NAME_RE.fullmatch(key):
            problems.append((f"{name}.{key}", "name must match [a-z_][a-z0-9_]* (<= 64 chars)"))
            continue
        norm = _confined_path(path, f"{name}.{key}", shared_root, problems)
        if norm is not None:
            out[key] = norm
    return out


def _scalar_ok(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= 1024
    return value is None or isinstance(value, (bool, int))


def _hyperparameters(raw: Mapping, stages: tuple[str, ...], allowed: tuple[str, ...],
                     problems: list) -> dict[str, dict[str, Any]]:
    value = raw.get("hyperparameters", {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(("hyperparameters", f"must be a mapping of stage -> {{key: value}}, got {type(value).__name__}"))
        return {}
    out: dict[str, dict[str, Any]] = {}
    for stage, params in value.items():
        where = f"hyperparameters.{stage}"
        if stage not in allowed and stage != RUN_SECTION:
            problems.append((where, f"unknown stage {stage!r}; allowed: {', '.join(allowed)} "
                                    f"(or '{RUN_SECTION}' for run-wide keys)"))
            continue
        if stages and stage not in stages and stage != RUN_SECTION:
            problems.append((where, f"stage {stage!r} is not in this run's stages {list(stages)}"))
            continue
        if params is None:
            continue
        if not isinstance(params, Mapping):
            problems.append((where, f"must be a mapping of key -> value, got {type(params).__name__}"))
            continue
        clean: dict[str, Any] = {}
        for key, item in params.items():
            if not isinstance(key, str) or not _HYPER_KEY_RE.fullmatch(key):
                problems.append((f"{where}.{key}", "key must be lower_snake_case, optionally dotted (optim.lr)"))
                continue
            if stage == RUN_SECTION and key.split(".", 1)[0] in _RUN_SECTION_FORBIDDEN:
                problems.append((f"{where}.{key}", "is set by the spec's own fields, not by hyperparameters"))
                continue
            ok = _scalar_ok(item) or (
                isinstance(item, list) and len(item) <= 256 and all(_scalar_ok(x) and x is not None for x in item)
            )
            if not ok:
                problems.append((f"{where}.{key}", f"must be a finite number, bool, string or list of them, got {item!r}"))
                continue
            clean[key] = list(item) if isinstance(item, list) else item
        out[stage] = clean
    return out


def parse_spec(raw: Any, *, source: str = "run spec", shared_root: str | None = None) -> RunSpec:
    """Validate a mapping into a :class:`RunSpec`; raise :class:`SpecError` listing every problem."""
    shared_root = shared_root or shared_root_from_env()
    problems: list[tuple[str, str]] = []
    if not isinstance(raw, Mapping):
        raise SpecError([("(top level)", f"must be a mapping, got {type(raw).__name__}")], source)
    for key in raw:
        if key not in _TOP_LEVEL_FIELDS:
            hint = " (stages come from the allow-list; script paths are not accepted)" if key in (
                "script", "script_path", "command", "entrypoint") else ""
            problems.append((str(key), f"unknown field{hint}; allowed: {', '.join(_TOP_LEVEL_FIELDS)}"))

    run_id = raw.get("run_id")
    if not is_valid_run_id(run_id):
        problems.append(("run_id", f"must be {RUN_ID_RULE}, got {_shown(run_id)}"))
        run_id = ""

    allowed = STAGES
    stages_raw = raw.get("stages")
    stages: tuple[str, ...] = ()
    if not isinstance(stages_raw, list) or not stages_raw:
        problems.append(("stages", f"must be a non-empty list drawn from {list(allowed)}, got {stages_raw!r}"))
    else:
        bad = [s for s in stages_raw if not isinstance(s, str) or s not in allowed]
        if bad:
            problems.append(("stages", f"unknown stage(s) {bad!r}; allowed: {', '.join(allowed)} "
                                       "(a run names stages, never a script path)"))
        elif len(set(stages_raw)) != len(stages_raw):
            problems.append(("stages", f"lists a stage twice: {stages_raw!r}"))
        elif list(stages_raw) != sorted(stages_raw, key=allowed.index):
            problems.append(("stages", f"must follow pipeline order {' -> '.join(allowed)}, got {stages_raw!r}"))
        else:
            stages = tuple(stages_raw)

    data = _path_map(raw, "data", shared_root, problems)
    models = _path_map(raw, "models", shared_root, problems)
    for name in models:
        if name not in MODEL_FIELDS:
            problems.append((f"models.{name}", f"unknown model slot; allowed: {', '.join(MODEL_FIELDS)}"))
    hyper = _hyperparameters(raw, stages, allowed, problems)
    nodes = _int_field(raw, "nodes", 1, 1, 64, problems)
    gpus = raw.get("gpus_per_node")
    if gpus is not None:
        gpus = _int_field(raw, "gpus_per_node", 1, 1, 16, problems)
    priority = raw.get("priority", "normal")
    if priority not in PRIORITIES:
        problems.append(("priority", f"must be one of {', '.join(PRIORITIES)}, got {priority!r}"))
        priority = "normal"
    max_attempts = _int_field(raw, "max_attempts", 3, 1, 100, problems)
    timeout = _int_field(raw, "timeout_seconds", 86400, 1, 7 * 86400, problems)

    if problems:
        raise SpecError(problems, source)
    spec = RunSpec(run_id=run_id, stages=stages, data=data, models=models, hyperparameters=hyper,
                   nodes=nodes, gpus_per_node=gpus, priority=priority, max_attempts=max_attempts,
                   timeout_seconds=timeout)
    size = len(spec.to_json().encode())
    if size > MAX_SPEC_BYTES:
        raise SpecError([("(payload)", f"{size} bytes once encoded; the limit is {MAX_SPEC_BYTES}")], source)
    problem = _training_config_problem(spec, shared_root)
    if problem:
        raise SpecError([problem], source)
    return spec


def _run_keys(spec: RunSpec) -> set[str]:
    """Dotted keys (and their parents) set through ``hyperparameters.run``."""
    keys: set[str] = set()
    for key in spec.hyperparameters.get(RUN_SECTION, {}):
        parts = key.split(".")
        keys.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return keys


def _training_config_problem(spec: RunSpec, shared_root: str) -> tuple[str, str] | None:
    """Check the derived training config with the training package (if importable)."""
    try:
        load_run_config(spec.to_training_config(shared_root))
    except ConfigError as exc:
        message = str(exc)
        key = message.split("=", 1)[0].split(":", 1)[0]
        head = key.split(".", 1)[0]
        if head in spec.hyperparameters:
            return f"hyperparameters.{key}", message
        if key in _run_keys(spec):
            return f"hyperparameters.{RUN_SECTION}.{key}", message
        if head == "data":
            return key, message
        for name, (section, field_name) in MODEL_FIELDS.items():
            if key == f"{section}.{field_name}" and name in spec.models:
                return f"models.{name}", message
        return key or "(training config)", message
    return None


def parse_spec_text(text: str, *, source: str = "run spec", fmt: str | None = None,
                    shared_root: str | None = None) -> RunSpec:
    """Parse YAML or JSON text (``fmt`` = ``json``/``yaml``; guessed from the first character otherwise)."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError([("(file)", f"{len(text.encode())} bytes; the limit is {MAX_SPEC_BYTES}")], source)
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "yaml")
    try:
        if fmt == "json":
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError([("(syntax)", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")],
                        source) from None
    except Exception as exc:  # yaml.YAMLError carries the line in its message
        raise SpecError([("(syntax)", f"invalid YAML: {exc}")], source) from None
    return parse_spec(raw, source=source, shared_root=shared_root)


def load_spec(path: str | os.PathLike, *, shared_root: str | None = None) -> RunSpec:
    """Read and validate a ``.yaml``/``.yml``/``.json`` run spec file."""
    path = Path(path)
    source = str(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SpecError([("(file)", f"cannot read: {exc.strerror}")], source) from None
    if size > MAX_SPEC_BYTES:
        raise SpecError([("(file)", f"{size} bytes; the limit is {MAX_SPEC_BYTES}")], source)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("(file)", f"cannot read as UTF-8 text: {exc}")], source) from None
    fmt = "json" if path.suffix.lower() == ".json" else "yaml"
    return parse_spec_text(text, source=source, fmt=fmt, shared_root=shared_root)
