"""Typed run configuration: one YAML run file plus ``--key=value`` overrides, read into a :class:`RunConfig`.

Pure Python (PyYAML only, no torch) so the queue can validate a run spec at submit
time exactly as the training job will read it::

    from training.config.run import load_run_config
    cfg = load_run_config("run.yaml", ["--retriever.optim.lr=3e-5", "--run_id=exp1"])

:class:`RunConfig` is the top level; its sections (one dataclass each, one docstring per field,
``__post_init__`` checks) are in :mod:`training.config.sections` and :mod:`training.config.ray_executor`.
Defaults are sized for the 2-core CPU demo on the synthetic set (a few minutes end to end); real runs set
their own steps, batch sizes and models. Unknown keys, wrong types and bad values raise
:class:`~training.config.sections.ConfigError` whose message names the dotted key and the offending value.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from contract.mappings import deep_merge
from contract.messages import shown
from contract.paths import DEFAULT_SHARED_ROOT, RUN_ID_RULE, is_valid_run_id
from contract.paths import run_dir as _run_dir
from training.config.ray_executor import TUNE_METRIC_RULE, RayExecutorConfig
from training.config.sections import (STAGES, CheckpointConfig, ConfigError, DataConfig, DistributedConfig,
                                      EvaluateConfig, GeneratorConfig, IndexConfig, MetricsConfig, RetrieverConfig,
                                      Stage, fail, require)


Device = Literal["auto", "cpu", "cuda"]


@dataclass
class RunConfig:
    run_id: str = "local"
    """Run name; outputs go to ``<shared_root>/runs/<run_id>/<stage>/`` (a Kubernetes label value)."""
    shared_root: str = DEFAULT_SHARED_ROOT
    """Root of the shared filesystem; every data and output path is confined to it."""
    stages: tuple[Stage, ...] = STAGES
    """Stages to run, a subset of retriever, index, generator, evaluate (run in that order)."""
    seed: int = 1234
    """Base seed for model init, data order and dropout."""
    device: Device = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    data: DataConfig = field(default_factory=DataConfig)
    """Dataset paths."""
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    """Retriever fine-tuning."""
    index: IndexConfig = field(default_factory=IndexConfig)
    """Corpus index build."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    """Generator fine-tuning."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """Evaluation."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing of the training stages."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Prometheus endpoint and logging cadence."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """How DDP synchronises gradients across ranks."""
    ray: RayExecutorConfig = field(default_factory=RayExecutorConfig)
    """The Ray executor: cluster address, per-stage resources and pools, failures, Tune search."""

    def __post_init__(self) -> None:
        require(is_valid_run_id(self.run_id), "run_id", self.run_id, f"must be {RUN_ID_RULE}")
        require(bool(self.shared_root), "shared_root", self.shared_root, "must be a non-empty path")
        require(len(self.stages) >= 1, "stages", self.stages, f"must list at least one of {', '.join(STAGES)}")
        require(len(set(self.stages)) == len(self.stages), "stages", self.stages, "lists a stage twice")
        # Canonical order, whatever order the file used.
        self.stages = tuple(s for s in STAGES if s in self.stages)
        metric = self.ray.tune.metric
        require(metric == "mrr" or int(metric[7:]) in self.evaluate.recall_at, "ray.tune.metric", metric,
                 f"must be {TUNE_METRIC_RULE} {list(self.evaluate.recall_at)}")
        self._check_elastic_workers()

    def _check_elastic_workers(self) -> None:
        """A Ray Train stage with ``ray.<stage>.workers: {min, max}`` keeps its global batch at every worker count
        (:mod:`training.elastic.sizes`, each Ray worker one rank), or the config is refused naming the batch."""
        from training.elastic.sizes import batch_problem

        for stage in self.stages:
            resources = getattr(self.ray, stage)
            if not resources.elastic:
                continue
            task = getattr(self, stage)
            problem = batch_problem(task.global_batch_size, task.grad_accum,
                                    list(range(resources.min_workers, resources.workers + 1)))
            if problem is not None:
                raise ConfigError(f"{stage}.{problem[0]}: ray.{stage}.workers {resources.min_workers}.."
                                  f"{resources.workers}: {problem[1]}", f"{stage}.{problem[0]}")

    # Paths ----------------------------------------------------------------------------
    def run_dir(self) -> Path:
        """``<shared_root>/runs/<run_id>``."""
        return _run_dir(self.shared_root, self.run_id)

    def stage_dir(self, stage: str) -> Path:
        """``<shared_root>/runs/<run_id>/<stage>``."""
        if stage not in STAGES:
            raise ConfigError(f"stage={shown(stage)}: unknown stage; allowed: {', '.join(STAGES)}", "stage")
        return self.run_dir() / stage

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping (lists for tuples) that :func:`load_run_config` reads back unchanged."""
        return _to_plain(dataclasses.asdict(self))


# --------------------------------------------------------------------------- nested mappings
# The one home of ragpool's nested-dict helpers (run config, run spec, demo, Helm values).


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": 1}`` -> ``{"optim": {"lr": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        out = deep_merge(out, _nested_one(key.split("."), value))
    return out


def _nested_one(parts: list[str], value: Any) -> dict[str, Any]:
    return {parts[0]: value if len(parts) == 1 else _nested_one(parts[1:], value)}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}`` (tuples become lists): the inverse of :func:`nest`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


# --------------------------------------------------------------------------- loading


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (from YAML or an override string) to the field type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        fail(key, value, "must be a boolean (true/false)")
    if tp is int:
        if isinstance(value, bool):
            fail(key, value, "must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        fail(key, value, "must be an integer")
    if tp is float:
        if isinstance(value, bool):
            fail(key, value, "must be a number")
        try:
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, str):
                return float(value.strip())
        except (ValueError, OverflowError):
            pass
        fail(key, value, "must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. run_id: 2024 in YAML
        fail(key, value, "must be a string")
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                value = yaml.safe_load(text)
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            fail(key, value, "must be a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value))
        if len(value) != len(args):
            fail(key, value, f"must have exactly {len(args)} items")
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        fail(key, value, f"must be one of {', '.join(map(str, allowed))}")
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported config field type {tp!r} for {key}")
    raise TypeError(f"unsupported config field type {tp!r} for {key}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        fail(prefix.rstrip(".") or "<root>", data, "must be a mapping of keys to values")
    normalize = getattr(cls, "normalize_tree", None)
    if normalize is not None:  # a section's own shorthand (RayStageConfig: workers: {min, max})
        data = normalize(data, prefix)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key)
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = ", ".join(sorted(fields))
            raise ConfigError(f"{dotted}={shown(value)}: unknown key; known keys here: {close}", dotted)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, f"{dotted}.")
        else:
            kwargs[key] = _coerce(dotted, value, tp)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        # __post_init__ names the bare field; add the section path.
        if prefix:
            raise err.under(prefix) from None
        raise


def parse_overrides(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """Split ``--section.key=value`` strings into ``(dotted_key, value)`` pairs."""
    pairs = []
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        if "=" not in text:
            raise ConfigError(f"{item!r}: override must look like --key=value or --section.key=value")
        key, value = text.split("=", 1)
        key = key.strip().replace("-", "_")  # --run-id=x and --run_id=x both work
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"{item!r}: override has an empty key")
        pairs.append((key, value))
    return pairs


def load_run_config(source: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                    overrides: Iterable[str] = ()) -> RunConfig:
    """Build a validated :class:`RunConfig` from a mapping or a YAML file, then overrides.

    ``overrides`` are ``--key=value`` strings (``--retriever.optim.lr=1e-4``); values
    are converted to the field's type. Raises :class:`ConfigError` on any problem.
    """
    if source is None:
        tree: dict[str, Any] = {}
    elif isinstance(source, Mapping):
        tree = deep_merge({}, source)
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"config file {str(path)!r}: cannot read ({err.strerror})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r}: invalid YAML ({err})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r}: top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded
    for key, value in parse_overrides(overrides):
        tree = deep_merge(tree, nest({key: value}))
    return _build(RunConfig, tree, "")


def split_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    """Return ``(config_path, overrides)`` from an entrypoint's argv.

    Accepts ``--config PATH`` or ``--config=PATH``; everything else must be ``--key=value``.
    """
    config: str | None = None
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config: missing file path")
            config = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        elif arg in ("-h", "--help"):
            print(_usage())
            raise SystemExit(0)
        else:
            overrides.append(arg)
        i += 1
    return config, overrides


def _usage() -> str:
    lines = ["usage: python -m training.<stage> --config RUN.yaml [--key=value ...]",
             "  e.g. --run_id=exp1 --shared_root=/tmp/shared --retriever.optim.lr=3e-5", "", "keys:"]
    lines += [f"  {key:34s} {doc.splitlines()[0] if doc else ''}" for key, doc in describe_fields()]
    return "\n".join(lines)


def describe_fields(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted_key, docstring)`` for every field, read from the source (for docs and --help)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):  # a subclass's own win
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                    and isinstance(getattr(b, "value", None), ast.Constant) and isinstance(b.value.value, str):
                docs[a.target.id] = b.value.value
    out: list[tuple[str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append((prefix + f.name, docs.get(f.name, "")))
        if dataclasses.is_dataclass(hints[f.name]):
            out.extend(describe_fields(hints[f.name], prefix + f.name + "."))
    return out
