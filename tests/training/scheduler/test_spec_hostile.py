"""Hostile run specs: ``ragpool submit`` refuses them cleanly (issue 13, "Run specs").

Property, for every generated spec file: ``submit`` exits 2, prints no traceback, the
message says nothing was submitted and names the offending key (for a file that cannot be
read as a spec at all: ``(file)`` or ``(syntax)``), and the queue's Redis namespace stays
empty. Valid generated specs are still accepted and enqueued.

Classes generated: a wrong type or value at every key the spec has (including the run
config's keys set through hyper-parameters), nulls, huge numbers, path tricks everywhere a
path can go (``data``, ``models``, model/tokenizer keys among the hyper-parameters),
identifiers and keys with control characters, YAML alias bombs, binary junk and truncated
files. ``submit`` runs in-process (``cli.cmd_submit``) against a real redis-server, so an
example costs a file write, a parse and one Redis lookup; ``slow`` runs >= 1000 examples,
the default run a few dozen. Subprocess runs confirm the real exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from contract.paths import child_env

from contract import exit_codes
from training.config.sections import MODEL_PATH_KEYS, STAGES
from contract.paths import is_valid_run_id
from training.scheduler.spec import SpecError
from training.scheduler.spec_file import load_spec
from training.scheduler import cli as runs_cli
from contract.lanes import PRIORITIES
from training.scheduler.spec import MAX_SPEC_BYTES

ROOT = "/mnt/shared"

BASE: dict[str, Any] = {
    "run_id": "hostile-base",
    "stages": ["retriever", "index", "generator", "evaluate"],
    "data": {"corpus": "datasets/demo/corpus.jsonl", "qa_train": "datasets/demo/qa_train.jsonl",
             "qa_eval": "datasets/demo/qa_eval.jsonl"},
    "models": {"retriever": "models/enc"},
    "hyperparameters": {
        "retriever": {"max_steps": 5, "optim.lr": 3.0e-5, "temperature": 0.05, "gather_negatives": True},
        "index": {"kind": "flat", "nlist": 4},
        "generator": {"tiny.arch": "llama", "tokenizer": "models/tok", "max_steps": 3},
        "evaluate": {"recall_at": [1, 5]},
        "run": {"seed": 7, "device": "cpu", "checkpoint.every_steps": 2, "ray.retriever.pool": "gpu-a"},
    },
    "nodes": 1,
    "gpus_per_node": 1,
    "priority": "normal",
    "max_attempts": 3,
    "timeout_seconds": 3600,
}

# -- values that are wrong for a kind of key, whatever else the spec says ----------------------

CONTAINERS = [None, {}, {"a": 1}, [], [{"x": 1}], [[1]]]
HUGE = [10**30, -10**30, 10**300, -(2**64)]
NON_FINITE = [math.nan, math.inf, -math.inf]
CONTROL = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=31), min_size=1, max_size=3)


def _with_control(base: str) -> st.SearchStrategy[str]:
    """``base`` with control characters before, inside or after it (``exp1\\n`` among them)."""
    return st.tuples(st.integers(0, len(base)), CONTROL).map(lambda t: base[:t[0]] + t[1] + base[t[0]:])


NOT_INT = st.sampled_from([*CONTAINERS, *HUGE, *NON_FINITE, 1.5, "abc", "", True, "1e999"])
NOT_POSITIVE_FLOAT = st.sampled_from([*CONTAINERS, *NON_FINITE, -10**30, -1.0, 0, "abc", "", False])
NOT_BOOL = st.sampled_from([*CONTAINERS, *NON_FINITE, 2, 0, "maybe", ""])
NOT_CHOICE = st.one_of(st.sampled_from([*CONTAINERS, *NON_FINITE, *HUGE, "", "CPU", "cuda ", "gpu"]),
                       _with_control("cpu"))
NOT_LABEL = st.one_of(st.sampled_from([*CONTAINERS, *NON_FINITE, "Bad_Pool", "-x", "x" * 64, "a.b"]),
                      _with_control("gpu-a"))
HOSTILE_PATH = st.one_of(
    st.sampled_from([
        "/etc/passwd", "/etc", "/", "/mnt/shared", "/mnt/sharedx/m", "/mnt/shared/../etc", "../x",
        "a/../../b", "..", "./..", "models/../../root/.ssh", "a\\..\\b", "a\x00b", " ", "", ".", "x/" * 600,
        *CONTAINERS, *HUGE, *NON_FINITE, True, 7,
    ]),
    _with_control("models/m"),
    st.text(min_size=1, max_size=30).map(lambda s: "/" + s.lstrip("/")).filter(lambda p: not p.startswith(ROOT)),
    st.lists(st.sampled_from(["..", "a", ".", ""]), min_size=1, max_size=6)
      .map("/".join).filter(lambda p: ".." in p.split("/")),
)
HOSTILE_MODEL_PATH = HOSTILE_PATH.filter(lambda v: v != "")  # "" = the packaged default model: valid
NOT_RUN_ID = st.one_of(st.sampled_from([*CONTAINERS, *HUGE, *NON_FINITE, 2024, True, "", "Exp1", "-a", "a" * 64]),
                       _with_control("exp1"), st.text(max_size=70).filter(lambda s: not is_valid_run_id(s)))
NOT_NAME = st.one_of(_with_control("corpus"), st.sampled_from(["Corpus", "co-rpus", "x" * 65, "1abc", 5, None]))
NOT_HYPER_KEY = st.one_of(_with_control("max_steps"), st.sampled_from(["Max_steps", "a..b", "x" * 65, 5, "a.b.c.d.e"]))


@dataclass(frozen=True)
class Slot:
    """One place in a spec and what is wrong for it there."""

    path: tuple[str, ...]
    values: st.SearchStrategy
    field: str | None = None
    """The field the refusal names (default: the dotted path)."""
    ray: bool = False
    """Submit it as an ``executor: ray`` run (its pools are checked; none are declared here)."""


HYPER = ("hyperparameters",)


def _ray(tree: dict) -> dict:
    return {**tree, "executor": "ray"}
SLOTS: list[Slot] = [
    Slot(("run_id",), NOT_RUN_ID),
    Slot(("stages",), st.one_of(
        st.sampled_from([*CONTAINERS[:3], *HUGE, "retriever", ["train.py"], ["index", "retriever"],
                         ["retriever", "retriever"], [None], ["/bin/sh"]]),
        st.lists(_with_control("index"), min_size=1, max_size=2))),
    Slot(("nodes",), st.one_of(NOT_INT, st.sampled_from([0, 65, -1]))),
    Slot(("gpus_per_node",), st.one_of(NOT_INT.filter(lambda v: v is not None), st.sampled_from([0, 17]))),
    Slot(("max_attempts",), st.one_of(NOT_INT, st.sampled_from([0, 101]))),
    Slot(("timeout_seconds",), st.one_of(NOT_INT, st.sampled_from([0, 7 * 86400 + 1]))),
    Slot(("priority",), st.one_of(NOT_CHOICE, st.sampled_from(["urgent", "HIGH"]), _with_control("high"))
         .filter(lambda v: v not in PRIORITIES)),
    Slot(("executor",), st.one_of(NOT_CHOICE, st.sampled_from(["Ray", "slurm", "/bin/sh"]), _with_control("ray"))),
    Slot(("data",), st.sampled_from([*HUGE, "datasets/x", ["a"], True])),
    Slot(("models",), st.sampled_from([*HUGE, "models/x", ["a"], True])),
    Slot(("hyperparameters",), st.sampled_from([*HUGE, "x", ["a"], True])),
    *[Slot(("data", name), HOSTILE_PATH) for name in ("corpus", "qa_train", "qa_eval")],
    Slot(("models", "retriever"), HOSTILE_PATH),
    Slot(("models", "generator"), HOSTILE_PATH),
    *[Slot((*HYPER, *key.split(".", 1)), HOSTILE_MODEL_PATH) for key in MODEL_PATH_KEYS],
    Slot((*HYPER, "retriever", "max_steps"), st.one_of(NOT_INT, st.just(0))),
    Slot((*HYPER, "retriever", "optim.lr"), NOT_POSITIVE_FLOAT),
    Slot((*HYPER, "retriever", "temperature"), st.one_of(NOT_POSITIVE_FLOAT, st.just(11.0))),
    Slot((*HYPER, "retriever", "gather_negatives"), NOT_BOOL),
    Slot((*HYPER, "index", "kind"), NOT_CHOICE),
    Slot((*HYPER, "index", "nlist"), st.one_of(NOT_INT, st.just(0))),
    Slot((*HYPER, "generator", "tiny.arch"), NOT_CHOICE),
    Slot((*HYPER, "evaluate", "recall_at"), st.sampled_from([None, {}, {"a": 1}, [{"x": 1}], [[1]], [0], ["x"],
                                                             [math.nan], "abc", 10**30])),
    Slot((*HYPER, "run", "seed"), st.sampled_from([None, {}, [{"x": 1}], *NON_FINITE, *HUGE, 1.5, "abc"])),
    Slot((*HYPER, "run", "device"), NOT_CHOICE),
    Slot((*HYPER, "run", "checkpoint.every_steps"), st.one_of(NOT_INT, st.just(-1))),
    Slot((*HYPER, "run", "ray.retriever.pool"), NOT_LABEL),
    Slot((*HYPER, "run", "run_id"), st.just("other")),
    Slot((*HYPER, "run", "data.corpus"), st.just("x.jsonl")),
    Slot((*HYPER, "run", "generator.model"), st.sampled_from(["/etc", "models/m", ""])),
    Slot((*HYPER, "retriever"), st.sampled_from([*HUGE, "x", ["a"], True])),
    Slot((*HYPER, "run", "ray.index.pool"), st.sampled_from(["undeclared", "gpu-b"]), ray=True),
    Slot((*HYPER, "retriever", "no_such_key"), st.sampled_from([1, "x", None])),
]
# A key (not a value) that is wrong: the refusal names the container it sits in.
KEY_SLOTS: list[Slot] = [
    Slot((), st.one_of(NOT_NAME, st.sampled_from(["script", "command", "entrypoint"])), field=""),
    Slot(("data",), NOT_NAME, field="data."),
    Slot(("models",), st.one_of(NOT_NAME, st.just("critic")), field="models."),
    Slot(HYPER, st.one_of(_with_control("retriever"), st.sampled_from(["trainer", "Run", 5])),
         field="hyperparameters."),
    Slot((*HYPER, "retriever"), NOT_HYPER_KEY, field="hyperparameters.retriever."),
]


def _set(tree: dict, path: tuple[str, ...], value: Any) -> dict:
    out = json.loads(json.dumps(tree))
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def _add_key(tree: dict, path: tuple[str, ...], key: Any) -> dict:
    out = json.loads(json.dumps(tree))
    node = out
    for part in path:
        node = node[part]
    node[key] = "models/x" if path and path[0] in ("data", "models") else 1
    return out


def _render(tree: dict, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(tree).encode()
    return yaml.safe_dump(tree, allow_unicode=False).encode()


@dataclass(frozen=True)
class Case:
    """A hostile spec file and the field its refusal must name (None: any whole-file field)."""

    text: bytes
    suffix: str
    field: str | None


def _value_cases() -> st.SearchStrategy[Case]:
    def build(slot: Slot) -> st.SearchStrategy[Case]:
        field = slot.field if slot.field is not None else ".".join(slot.path)
        return st.tuples(slot.values, st.sampled_from(["yaml", "json"])).map(
            lambda vf: Case(_render(_set(_ray(BASE) if slot.ray else BASE, slot.path, vf[0]), vf[1]), "." + vf[1],
                            field))
    return st.sampled_from(SLOTS).flatmap(build)


def _key_cases() -> st.SearchStrategy[Case]:
    def build(slot: Slot) -> st.SearchStrategy[Case]:
        return st.tuples(slot.values, st.sampled_from(["yaml", "json"])).map(
            lambda kf: Case(_render(_add_key(BASE, slot.path, kf[0]), kf[1]), "." + kf[1], slot.field))
    # JSON keys must be strings; YAML keeps an int key an int.
    return st.sampled_from(KEY_SLOTS).flatmap(build)


@st.composite
def _alias_bombs(draw) -> Case:
    width, depth = draw(st.integers(2, 9)), draw(st.integers(2, 9))
    where = draw(st.sampled_from(["top", "hyper", "data", "run_id"]))
    lines = [f'a0: &a0 [{",".join(["lol"] * width)}]']
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    if where == "top":
        text = "run_id: bomb\nstages: [retriever]\n" + "\n".join(lines) + "\n"
    elif where == "hyper":
        text = ("run_id: bomb\nstages: [retriever]\nhyperparameters:\n  retriever:\n"
                + "".join(f"    {line.replace('a', 'k', 1)}\n" for line in lines))
    elif where == "data":
        text = "run_id: bomb\nstages: [retriever]\ndata:\n" + "".join(f"  {line}\n" for line in lines)
    else:
        text = "run_id: &r bomb\nstages: [retriever]\nx: *r\n"
    return Case(text.encode(), ".yaml", "(syntax)")


@st.composite
def _truncated(draw) -> Case:
    fmt = draw(st.sampled_from(["yaml", "json"]))
    # stages last, so any cut before its closing bracket leaves an invalid spec
    tree = {k: v for k, v in BASE.items() if k != "stages"}
    text = _render(tree, fmt).decode()
    tail = ('stages: [retriever, index, generator, evaluate]\n' if fmt == "yaml"
            else ', "stages": ["retriever", "index", "generator", "evaluate"]}')
    text = (text + tail) if fmt == "yaml" else (text.rstrip()[:-1] + tail)
    cut = draw(st.integers(0, len(text) - (2 if fmt == "yaml" else 3)))
    return Case(text[:cut].encode(), "." + fmt, None)


def _junk() -> st.SearchStrategy[Case]:
    raw = st.binary(min_size=1, max_size=2048)
    prefixed = st.tuples(st.sampled_from([b"run_id: ok\nstages: [retriever]\n", b"{", b"run_id: "]), raw).map(
        lambda t: t[0] + t[1])
    return st.tuples(st.one_of(raw, prefixed), st.sampled_from([".yaml", ".json", ".yml"])).map(
        lambda t: Case(t[0], t[1], None))


def _deep() -> st.SearchStrategy[Case]:
    return st.integers(40, 20000).flatmap(lambda n: st.sampled_from([
        Case(b"run_id: ok\nstages: [retriever]\nx: " + b"[" * n + b"]" * n + b"\n", ".yaml", "(syntax)"),
        Case(b'{"run_id": "ok", "stages": ["retriever"], "x": ' + b"[" * n + b"]" * n + b"}", ".json", "(syntax)"),
    ]))


HOSTILE = st.one_of(_value_cases(), _key_cases(), _alias_bombs(), _truncated(), _junk(), _deep())


# -- the property ----------------------------------------------------------------------------

@pytest.fixture
def submit(redis_server, monkeypatch, tmp_path):
    """``submit(bytes, suffix) -> (exit code, stderr)``: the CLI's submit, in-process, on a fresh
    namespace of the session's redis-server; ``submit.enqueued()`` lists what the namespace holds."""
    namespace = f"h{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", namespace)
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", ROOT)
    monkeypatch.delenv("RAGPOOL_RAY_POOLS", raising=False)  # no Ray pools declared
    client = redis_server.client()
    counter = iter(range(10**9))

    def run(text: bytes, suffix: str) -> tuple[int, str]:
        path = tmp_path / f"spec-{next(counter)}{suffix}"
        path.write_bytes(text)
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = runs_cli.cmd_submit(argparse.Namespace(file=str(path), wait=False, wait_seconds=None, json=False))
        path.unlink()
        return code, err.getvalue()

    run.enqueued = lambda: client.keys(f"{namespace}:*")
    run.tmp_dir = tmp_path
    yield run
    client.close()


def _is_valid_spec(case: Case, tmp_dir: Path) -> bool:
    path = tmp_dir / f"probe{case.suffix}"
    path.write_bytes(case.text)
    try:
        load_spec(path, shared_root=ROOT)
    except SpecError:
        return False
    finally:
        path.unlink()
    return True


def check_refused(submit, case: Case) -> None:
    if case.field is None and _is_valid_spec(case, submit.tmp_dir):
        reject()  # junk that happens to leave a valid spec (a comment or blank appended) is not hostile
    code, err = submit(case.text, case.suffix)
    assert code == exit_codes.BAD_INPUT, (code, err, case)
    assert "Traceback" not in err and "nothing was submitted" in err, err
    fields = [line.strip().split(": ", 1)[0] for line in err.splitlines()[1:] if line.startswith("  ")]
    assert fields, err
    if case.field is None:  # a whole-file case: whichever field the truncation or junk broke
        pass
    elif case.field.endswith(".") or case.field == "":
        assert any(f.startswith(case.field) and f != case.field.rstrip(".") for f in fields), (case.field, err)
    else:
        assert any(f == case.field or f.startswith(case.field + ".") or f.startswith(case.field + "[")
                   for f in fields), (case.field, err)
    assert max(len(line) for line in err.splitlines()) < 600, "messages stay bounded"
    assert submit.enqueued() == [], "nothing may reach the queue"


_FAST = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])


@settings(max_examples=60, **_FAST)
@given(case=HOSTILE)
def test_hostile_specs_are_refused(submit, case):
    check_refused(submit, case)


@pytest.mark.slow
@settings(max_examples=1200, **_FAST)
@given(case=HOSTILE)
def test_hostile_specs_are_refused_many(submit, case):
    check_refused(submit, case)


# -- valid specs still get in ----------------------------------------------------------------

@st.composite
def _valid_specs(draw) -> dict:
    stages = [s for s in STAGES if draw(st.booleans())] or ["index"]
    run_id = draw(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True))
    spec: dict[str, Any] = {"run_id": run_id, "stages": stages,
                            "priority": draw(st.sampled_from(PRIORITIES)),
                            "max_attempts": draw(st.integers(1, 100)),
                            "timeout_seconds": draw(st.integers(1, 7 * 86400)),
                            "nodes": draw(st.integers(1, 64))}
    segment = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,15}", fullmatch=True).filter(lambda s: s not in ("..",))
    rel = st.lists(segment, min_size=1, max_size=4).map("/".join)
    # every run names its data (submit requires it); these files do not exist: the shared root is not mounted
    path = st.one_of(rel, rel.map(lambda p: f"{ROOT}/{p}"))
    spec["data"] = {name: draw(path) for name in ("corpus", "qa_train", "qa_eval")}
    hyper: dict[str, dict] = {}
    if "retriever" in stages:
        hyper["retriever"] = {"max_steps": draw(st.integers(1, 10**6)),
                              "optim.lr": draw(st.floats(1e-7, 0.5)),
                              "model": draw(st.one_of(st.just(""), rel))}
    if "generator" in stages:
        hyper["generator"] = {"tokenizer": draw(st.one_of(st.just(""), rel))}
    hyper["run"] = {"seed": draw(st.integers(0, 2**31))}
    spec["hyperparameters"] = hyper
    return spec


@settings(max_examples=25, **_FAST)
@given(raw=_valid_specs(), fmt=st.sampled_from(["yaml", "json"]))
def test_valid_generated_specs_are_accepted(submit, redis_server, raw, fmt):
    raw = {**raw, "run_id": f"{raw['run_id']}-{uuid.uuid4().hex[:8]}"}  # one namespace for every example
    code, err = submit(_render(raw, fmt), "." + fmt)
    assert code == exit_codes.OK, err
    assert any(key.endswith(f":task:{raw['run_id']}") for key in submit.enqueued())


# -- real processes ----------------------------------------------------------------------------

def _bomb_text() -> str:
    lines = ["run_id: bomb", "stages: [retriever]", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name, content", [
    ("bomb.yaml", _bomb_text()),
    ("/dev/zero", None),
    ("escape.yaml", "run_id: esc\nstages: [generator]\nhyperparameters: {generator: {model: /root/.cache/m}}\n"),
    ("junk.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"),
])
def test_submit_in_a_real_process_exits_2_without_a_traceback(redis_server, namespace, tmp_path, name, content):
    if content is None:
        path = Path(name)
    else:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    env = child_env(REDIS_URL=redis_server.url, RAGPOOL_QUEUE_NAMESPACE=namespace, RAGPOOL_SHARED_ROOT=ROOT)
    proc = subprocess.run([sys.executable, "-m", "training.scheduler.cli", "submit", str(path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_codes.BAD_INPUT, proc.stderr
    assert "Traceback" not in proc.stderr and "nothing was submitted" in proc.stderr, proc.stderr
    assert len(proc.stderr) < 2000
    assert redis_server.client().keys(f"{namespace}:*") == []
    if name == "/dev/zero":
        assert f"limit is {MAX_SPEC_BYTES}" in proc.stderr
