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
    hyperparameters:                 # the run config's own sections; dotted keys nest
      retriever: {max_steps: 200, global_batch_size: 32, optim.lr: 2.0e-5}
      generator: {optim.lr: 1.0e-4}
      run: {seed: 7, checkpoint.every_steps: 100}   # run-wide keys (not run_id/shared_root/stages/data
                                                    # and not a stage's section)
    nodes: 1                         # > 1 runs as an Indexed Job with torchrun c10d rendezvous;
                                     # {min: 2, max: 4}: elastic (training/elastic/), trains on 2 to 4
    pool: gpu-spot                   # optional: the GPU pool to run on (default: the stack's first)
    gpus_per_node: null              # processes per node; null = all GPUs of the pod (1 on CPU)
    priority: normal                 # high | normal | low
    max_attempts: 3                  # failures before the dead-letter list
    timeout_seconds: 86400           # per attempt

The hyper-parameter sections *are* the run config's sections (``training.config.sections.STAGES``
plus ``run`` for the run-wide keys): the training config the worker will write is
built from them and checked by the run config's own dataclasses
(``training.config.run.load_run_config``, torch-free) at submit time, so a wrong
hyper-parameter name or value is rejected before it reaches the queue, and the run
config's :class:`~training.config.sections.ConfigError` names the dotted key that the spec
maps back to its own field.

Paths: every path a spec can name (``data.*``, ``models.*`` and the model/tokenizer
keys ``training.config.sections.MODEL_PATH_KEYS`` set through hyper-parameters) goes through
:func:`contract.paths.confine` and is stored relative to the shared root. The one
allowed value that is not a path is the empty string for a model key (the packaged
default model). Hugging Face hub names are not accepted as such: pods have no
internet, so a name like ``org/model`` is read as the directory
``<shared root>/org/model`` (put the model there first); where the shared storage is
visible, submit refuses one that is not there, with that hint
(training/scheduler/submit_checks.py). A URL or anything else that
starts with a scheme (``file:///etc/passwd``, ``s3://bucket/x``, ``hf:org/model``) is
refused at submit (exit 2, naming the key): paths are relative to the shared root.

Hostile input: a spec file or text is read by ``spec_file.py`` (bounded, UTF-8, no YAML aliases, nesting
bounded); the stored payload is bounded by :data:`MAX_SPEC_BYTES` too, and every value a message shows is cut
short.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from contract.mappings import deep_merge
from training.config.run import RunConfig, load_run_config, nest
from training.config.sections import MODEL_PATH_KEYS, STAGES, ConfigError
from contract.lanes import DEFAULT_PRIORITY, EXECUTORS, MAX_NODES, POOLS_ENV, PRIORITIES, Executor, Lane, LaneError, declared_pools
from contract.messages import shown
from contract.paths import RUN_ID_RULE, PathError, confine, is_valid_run_id, shared_root_from_env


MAX_SPEC_BYTES = 64 * 1024
"""Upper bound on a spec file and on its stored JSON payload."""
MAX_INT = 2**63 - 1
"""Largest magnitude of an integer hyper-parameter."""

_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_HYPER_KEY_RE = re.compile(r"[a-z_][a-z0-9_]{0,63}(\.[a-z_][a-z0-9_]{0,63}){0,3}")
# Spec ``models`` entries -> (section, key) of the training config they set.
MODEL_FIELDS: dict[str, tuple[str, str]] = {
    "retriever": ("retriever", "model"),
    "generator": ("generator", "model"),
    "tokenizer": ("generator", "tokenizer"),
}
assert {f"{s}.{k}" for s, k in MODEL_FIELDS.values()} <= set(MODEL_PATH_KEYS)
assert all(key.count(".") == 1 for key in MODEL_PATH_KEYS)
RUN_SECTION = "run"
"""``hyperparameters.run``: run-wide training keys (seed, device, checkpoint.*, metrics.*)."""
SECTIONS: tuple[str, ...] = (*STAGES, RUN_SECTION)
"""The hyper-parameter sections: the run config's stage sections, then the run-wide one."""
_SPEC_OWN_KEYS = ("run_id", "shared_root", "stages", "data")
"""Run config keys the spec's own fields set (never through ``hyperparameters.run``)."""
_TOP_LEVEL_FIELDS = (
    "run_id", "stages", "data", "models", "hyperparameters", "nodes", "gpus_per_node",
    "priority", "max_attempts", "timeout_seconds", "executor", "pool",
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
    """Per-section scalar hyper-parameters (:data:`SECTIONS`); keys may be dotted (``optim.lr``);
    model/tokenizer paths among them are stored relative to the shared root."""
    nodes: int = 1
    """Number of pods (torchrun ``--nnodes``); of an elastic run the most (its gang and lane)."""
    min_nodes: int | None = None
    """An elastic run (``nodes: {min, max}``): the fewest pods it trains on (``--nnodes MIN:MAX``); None = fixed."""
    gpus_per_node: int | None = None
    """Processes per pod (torchrun ``--nproc-per-node``); None = the pod's GPU count, 1 on CPU."""
    priority: str = DEFAULT_PRIORITY
    """Queue priority: ``high``, ``normal`` or ``low`` (contract/lanes.py ``PRIORITIES``)."""
    max_attempts: int = 3
    """Attempts (claims that fail) before the task goes to the dead-letter list."""
    timeout_seconds: int = 86400
    """Wall-clock limit of one attempt; the worker stops the run and counts a failure."""
    executor: str = Executor.TORCHRUN.value
    """:data:`EXECUTORS`; ``ray`` takes its per-stage resources from ``hyperparameters.run`` ``ray.*``."""
    pool: str | None = None
    """The GPU pool a torchrun run must run on (``contract/lanes.py``); None = the stack's
    default pool (its first GPU pool). Refused with ``executor: ray`` (ray stages pick pools)."""

    def to_payload(self) -> dict[str, Any]:
        """The JSON-able mapping stored in the queue (round-trips through ``parse_spec``)."""
        return {
            "run_id": self.run_id,
            "stages": list(self.stages),
            "data": dict(self.data),
            "models": dict(self.models),
            "hyperparameters": {k: dict(v) for k, v in self.hyperparameters.items()},
            "nodes": self.nodes if self.min_nodes is None else {"min": self.min_nodes, "max": self.nodes},
            "gpus_per_node": self.gpus_per_node,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
            # Only when not the default: payloads of torchrun runs stay as they were.
            **({"executor": self.executor} if self.executor != _default("executor") else {}),
            **({"pool": self.pool} if self.pool is not None else {}),
        }

    def to_training_config(self, shared_root: str) -> dict[str, Any]:
        """The mapping ``training.config.run.load_run_config`` reads (the worker writes it as run.yaml).

        Data paths stay relative to ``shared_root`` (the config confines them itself);
        model paths (``models`` and the model keys among the hyper-parameters) become absolute
        under it (the config takes a directory).
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
            config.setdefault(section, {})[key] = rel
        for dotted in MODEL_PATH_KEYS:
            section, key = dotted.split(".")
            rel = config.get(section, {}).get(key)
            if rel:  # empty = the packaged default model
                config[section][key] = posixpath.join(shared_root, rel)
        return config

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, compact): equal specs give equal strings."""
        return json.dumps(self.to_payload(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, *, shared_root: str | None = None) -> "RunSpec":
        """Validate a stored spec again (a worker: against its own ``shared_root`` and environment)."""
        return parse_spec(json.loads(text), source="stored spec", shared_root=shared_root)

    @classmethod
    def from_validated_json(cls, text: str) -> "RunSpec":
        """A spec :meth:`to_json` wrote after another process validated it (a gang's index 0 publishes
        the run it claimed): rebuilt as it was, checked nothing again."""
        payload = json.loads(text)
        nodes = payload.get("nodes", 1)
        ranged = {"nodes": nodes["max"], "min_nodes": nodes["min"]} if isinstance(nodes, dict) else {}
        return cls(**{**payload, "stages": tuple(payload["stages"]), **ranged})


def _key(value: Any) -> str:
    """A mapping key as it appears in a field name (``data.<key>``): itself, or bounded."""
    return value if isinstance(value, str) and len(value) <= 64 and value.isprintable() else shown(value, 40)


def _int_field(raw: Mapping, name: str, default: int, lo: int, hi: int, problems: list) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((name, f"must be an integer in [{lo}, {hi}], got {shown(value)}"))
        return default
    if not lo <= value <= hi:
        problems.append((name, f"must be in [{lo}, {hi}], got {value}"))
        return default
    return value


def _confined_path(value: Any, name: str, shared_root: str, problems: list) -> str | None:
    """``value`` as a shared-root-relative path (:func:`contract.paths.confine`), or record why not."""
    try:
        return confine(value, root=shared_root)
    except PathError as err:
        problems.append((name, f"{shown(value)} {err}"))
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
            problems.append((f"{name}.{_key(key)}", "name must match [a-z_][a-z0-9_]* (<= 64 chars)"))
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
    if isinstance(value, int) and not isinstance(value, bool):
        return -MAX_INT <= value <= MAX_INT
    return value is None or isinstance(value, bool)


def _hyper_value(where: str, item: Any, shared_root: str, problems: list) -> tuple[bool, Any]:
    """(ok, value) of one hyper-parameter; a model path (``where`` ends in one of
    :data:`MODEL_PATH_KEYS`) is confined and stored relative to the shared root."""
    dotted = where.split(".", 1)[1]
    if dotted in MODEL_PATH_KEYS:
        if item == "":
            return True, ""  # the packaged default model
        norm = _confined_path(item, where, shared_root, problems)
        return norm is not None, norm
    ok = _scalar_ok(item) or (
        isinstance(item, list) and len(item) <= 256 and all(_scalar_ok(x) and x is not None for x in item)
    )
    if not ok:
        problems.append((where, f"must be a finite number (|n| <= 2**63-1), bool, string (<= 1024 chars) "
                                f"or list of them, got {shown(item)}"))
        return False, None
    return True, list(item) if isinstance(item, list) else item


def _hyperparameters(raw: Mapping, stages: tuple[str, ...], shared_root: str,
                     problems: list) -> dict[str, dict[str, Any]]:
    value = raw.get("hyperparameters", {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(("hyperparameters", f"must be a mapping of stage -> {{key: value}}, got {type(value).__name__}"))
        return {}
    out: dict[str, dict[str, Any]] = {}
    for stage, params in value.items():
        where = f"hyperparameters.{_key(stage)}"
        if stage not in SECTIONS:
            problems.append((where, f"unknown stage {shown(stage, 40)}; allowed: {', '.join(STAGES)} "
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
                problems.append((f"{where}.{_key(key)}", "key must be lower_snake_case, optionally dotted (optim.lr), <= 64 chars a part"))
                continue
            head = key.split(".", 1)[0]
            if stage == RUN_SECTION and head in _SPEC_OWN_KEYS:
                problems.append((f"{where}.{key}", "is set by the spec's own fields, not by hyperparameters"))
                continue
            if stage == RUN_SECTION and head in STAGES:
                problems.append((f"{where}.{key}", f"belongs in hyperparameters.{head}, the stage's own section"))
                continue
            ok, clean_value = _hyper_value(f"{where}.{key}", item, shared_root, problems)
            if ok:
                clean[key] = clean_value
        out[stage] = clean
    return out


def _default(name: str) -> Any:
    """The default of :class:`RunSpec` field ``name``: where a spec's defaults are written, once."""
    return RunSpec.__dataclass_fields__[name].default


def parse_spec(raw: Any, *, source: str = "run spec", shared_root: str | None = None,
               environ: Mapping[str, str] | None = None) -> RunSpec:
    """Validate a mapping into a :class:`RunSpec`; raise :class:`SpecError` listing every problem (``environ``:
    the namespace's facts, ``RAGPOOL_POOLS`` and ``RAGPOOL_RAY_POOLS``; None: this process's environment)."""
    shared_root = shared_root or shared_root_from_env()
    problems: list[tuple[str, str]] = []
    if not isinstance(raw, Mapping):
        raise SpecError([("(top level)", f"must be a mapping, got {type(raw).__name__}")], source)
    for key in raw:
        if key not in _TOP_LEVEL_FIELDS:
            hint = " (stages come from the allow-list; script paths are not accepted)" if key in (
                "script", "script_path", "command", "entrypoint") else ""
            problems.append((_key(key), f"unknown field{hint}; allowed: {', '.join(_TOP_LEVEL_FIELDS)}"))

    run_id = raw.get("run_id")
    if not is_valid_run_id(run_id):
        problems.append(("run_id", f"must be {RUN_ID_RULE}, got {shown(run_id)}"))
        run_id = ""

    allowed = STAGES
    stages_raw = raw.get("stages")
    stages: tuple[str, ...] = ()
    if not isinstance(stages_raw, list) or not stages_raw:
        problems.append(("stages", f"must be a non-empty list drawn from {list(allowed)}, got {shown(stages_raw)}"))
    else:
        bad = [s for s in stages_raw if not isinstance(s, str) or s not in allowed]
        if bad:
            problems.append(("stages", f"unknown stage(s) {shown(bad)}; allowed: {', '.join(allowed)} "
                                       "(a run names stages, never a script path)"))
        elif len(set(stages_raw)) != len(stages_raw):
            problems.append(("stages", f"lists a stage twice: {shown(stages_raw)}"))
        elif list(stages_raw) != sorted(stages_raw, key=allowed.index):
            problems.append(("stages", f"must follow pipeline order {' -> '.join(allowed)}, got {shown(stages_raw)}"))
        else:
            stages = tuple(stages_raw)

    data = _path_map(raw, "data", shared_root, problems)
    models = _path_map(raw, "models", shared_root, problems)
    hyper = _hyperparameters(raw, stages, shared_root, problems)
    for name in models:
        if name not in MODEL_FIELDS:
            problems.append((f"models.{name}", f"unknown model slot; allowed: {', '.join(MODEL_FIELDS)}"))
            continue
        section, key = MODEL_FIELDS[name]
        if key in hyper.get(section, {}):
            problems.append((f"models.{name}", f"also set as hyperparameters.{section}.{key}; set it in one place"))
    nodes, min_nodes = _nodes_field(raw, problems)
    gpus = raw.get("gpus_per_node")
    if gpus is not None:
        gpus = _int_field(raw, "gpus_per_node", 1, 1, 16, problems)
    priority = raw.get("priority", _default("priority"))
    if priority not in PRIORITIES:
        problems.append(("priority", f"must be one of {', '.join(PRIORITIES)}, got {shown(priority)}"))
        priority = _default("priority")
    max_attempts = _int_field(raw, "max_attempts", _default("max_attempts"), 1, 100, problems)
    timeout = _int_field(raw, "timeout_seconds", _default("timeout_seconds"), 1, 7 * 86400, problems)
    executor = raw.get("executor", _default("executor"))
    if executor not in EXECUTORS:
        problems.append(("executor", f"must be one of {', '.join(EXECUTORS)}, got {shown(executor)}"))
        executor = _default("executor")
    elif executor == "ray" and nodes > 1:
        problems.append(("nodes", f"must be 1 for executor: ray, got {shown(raw.get('nodes'))}: the Ray cluster "
                                  "sizes a ray run (hyperparameters.run ray.<stage>.workers), not pods; a range "
                                  "of workers: ray.<stage>.workers.min and .max"))
    pool = _pool_field(raw, executor, problems, environ)

    if problems:
        raise SpecError(problems, source)
    spec = RunSpec(run_id=run_id, stages=stages, data=data, models=models, hyperparameters=hyper,
                   nodes=nodes, min_nodes=min_nodes, gpus_per_node=gpus, priority=priority, max_attempts=max_attempts,
                   timeout_seconds=timeout, executor=executor, pool=pool)
    size = len(spec.to_json().encode())
    if size > MAX_SPEC_BYTES:
        raise SpecError([("(payload)", f"{size} bytes once encoded; the limit is {MAX_SPEC_BYTES}")], source)
    try:  # the derived training config, checked once by the run config's own dataclasses
        cfg = load_run_config(spec.to_training_config(shared_root))
    except ConfigError as exc:
        raise SpecError([(_spec_field(spec, exc.key), str(exc))], source) from None
    problems = parallelism_problems(spec, shared_root, cfg) + elastic_problems(spec, cfg)
    if problems:
        raise SpecError(problems, source)
    if spec.executor == "ray":
        problems = ray_problems(spec, shared_root, cfg, environ)
        if problems:
            raise SpecError(problems, source)
    return spec


def _nodes_field(raw: Mapping, problems: list) -> tuple[int, int | None]:
    """``nodes``: an integer (a fixed-size run), or ``{min, max}`` (an elastic one, 1 <= min <= max <=
    MAX_NODES; min == max is the fixed size). Returns (max, min or None)."""
    value = raw.get("nodes", _default("nodes"))
    if not isinstance(value, Mapping):
        return _int_field(raw, "nodes", _default("nodes"), 1, MAX_NODES, problems), None
    unknown = [k for k in value if k not in ("min", "max")]
    if unknown:
        problems.append(("nodes", f"unknown key(s) {shown(unknown)}: give nodes: {{min: M, max: N}} or an integer"))
        return _default("nodes"), None
    missing = [k for k in ("min", "max") if k not in value]
    if missing:
        problems.append(("nodes", f"a range needs min and max; missing {', '.join(missing)}"))
        return _default("nodes"), None
    bad = len(problems)
    lo = _int_field(value, "min", 0, 1, MAX_NODES, problems)
    hi = _int_field(value, "max", 0, 1, MAX_NODES, problems)
    problems[bad:] = [(f"nodes.{key}", message) for key, message in problems[bad:]]
    if len(problems) > bad:
        return _default("nodes"), None
    if lo > hi:
        problems.append(("nodes.min", f"must be <= nodes.max ({hi}), got {lo}"))
        return _default("nodes"), None
    return hi, (lo if lo < hi else None)


def elastic_problems(spec: RunSpec, cfg: RunConfig) -> list[tuple[str, str]]:
    """An elastic run keeps each training stage's global batch at every world size of its range
    (``training.elastic.sizes``: the micro-batch of the largest world, more accumulation at fewer nodes). The
    ranks per node are ``gpus_per_node`` (1 when left to the pod: the ranks check it again at start)."""
    if spec.min_nodes is None:
        return []
    from training.elastic.sizes import NodeRange, batch_problem

    worlds = NodeRange(spec.min_nodes, spec.nodes).worlds(spec.gpus_per_node or 1)
    out = []
    for stage in spec.stages:
        section = getattr(cfg, stage, None)
        if getattr(section, "global_batch_size", None) is None:
            continue
        problem = batch_problem(section.global_batch_size, section.grad_accum, worlds)
        if problem is not None:
            out.append((_spec_field(spec, f"{stage}.{problem[0]}"),
                        f"nodes {spec.min_nodes}..{spec.nodes}: {problem[1]}"))
    return out


def _pool_field(raw: Mapping, executor: str, problems: list, environ: Mapping[str, str] | None = None) -> str | None:
    """``pool``: a pool name, known to the stack when the submitter knows its pools
    (``RAGPOOL_POOLS``, see ``lanes.declared_pools``), and only for torchrun runs."""
    pool = raw.get("pool")
    if pool is None:
        return None
    try:
        Lane("torchrun", 1, pool)
    except LaneError:
        problems.append(("pool", f"must be a pool name (a DNS label), got {shown(pool)}"))
        return None
    if executor == "ray":
        problems.append(("pool", "is for torchrun runs; an executor: ray run picks a pool per stage "
                                 "(hyperparameters.run ray.<stage>.pool)"))
        return None
    pools = declared_pools(environ)
    if pools is not None and pool not in pools:
        problems.append(("pool", f"pool {pool!r} does not exist in this stack; pools: "
                                 f"{', '.join(pools) or f'none ({POOLS_ENV} is empty)'}"))
        return None
    return pool


def ray_problems(spec: RunSpec, shared_root: str, cfg: RunConfig | None = None,
                 environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """A ray run's stages must name declared pools whose nodes hold their GPUs per worker
    (``cfg``: the spec's training config when already loaded)."""
    from training.config.ray_executor import RAY_STAGES
    from contract.ray_pools import PoolsError, declared_pools, pool_problems

    try:
        pools = declared_pools(environ)
    except PoolsError as err:
        return [("(environment)", str(err))]
    cfg = cfg or load_run_config(spec.to_training_config(shared_root))
    wanted = {s: (cfg.ray.stage(s).pool, cfg.ray.stage(s).gpus) for s in RAY_STAGES
              if s == "prepare" or s in spec.stages}
    return [(_spec_field(spec, key), message) for key, message in pool_problems(wanted, pools)]


def _spec_field(spec: RunSpec, key: str | None) -> str:
    """The spec field that sets the run config's dotted ``key`` (a :class:`ConfigError`'s key)."""
    if not key:
        return "(training config)"
    base = key.split("[", 1)[0]  # evaluate.recall_at[0] -> evaluate.recall_at
    head = base.split(".", 1)[0]
    for name, (section, field_name) in MODEL_FIELDS.items():
        if base == f"{section}.{field_name}" and name in spec.models:
            return f"models.{name}"
    if head in STAGES:
        return f"hyperparameters.{key}"
    if head in _SPEC_OWN_KEYS:
        return key
    return f"hyperparameters.{RUN_SECTION}.{key}"


def parallelism_problems(spec: RunSpec, shared_root: str, cfg: RunConfig | None = None) -> list[tuple[str, str]]:
    """``hsdp`` replicates across nodes and shards within one: it needs a torchrun run of ``nodes`` >= 2
    (the world is nodes x gpus_per_node, so it divides into nodes). Which stage may shard at all is the
    run config's own check (its ``parallelism`` types); ``fsdp`` on one rank is allowed (it warns).
    ``cfg``: the spec's training config when already loaded."""
    cfg = cfg or load_run_config(spec.to_training_config(shared_root))
    out = []
    for stage in spec.stages:
        if getattr(getattr(cfg, stage), "parallelism", None) is None \
                or getattr(cfg, stage).parallelism.strategy != "hsdp":
            continue
        key = _spec_field(spec, f"{stage}.parallelism.strategy")
        if spec.executor != "torchrun":
            out.append((key, f"hsdp needs torchrun's fixed GPUs per node to build its node x GPU mesh; "
                             f"executor: {spec.executor} places workers freely: use fsdp"))
        elif spec.nodes < 2:
            out.append((key, f"hsdp shards within a node and replicates across nodes, but nodes: {spec.nodes} "
                             "gives one node: use fsdp, or nodes >= 2"))
        elif (spec.min_nodes or spec.nodes) < 2:
            # The mesh is (nodes, gpus per node) at every size of the range: one node has no replica dimension.
            out.append(("nodes.min", f"hsdp needs >= 2 nodes at every size of the range, but nodes.min is "
                                     f"{spec.min_nodes}: set nodes.min >= 2, or use fsdp ({key})"))
    return out
