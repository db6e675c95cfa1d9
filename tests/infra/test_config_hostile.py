"""Hostile stack files: `ragpool config check` and `ragpool plan` refuse them cleanly.

Property (for every generated file): both commands exit 2, print no traceback, name the
offending key (or, for a file that cannot be read as a mapping at all, the file), and
`plan --out` writes nothing. Valid variations are still accepted.

The commands run in-process (``infra.cli.main``): the plan stops at validation, so an
example costs a YAML load and a parse, not a Pulumi run. ``slow`` runs >= 1000 examples;
the default run 25. Two subprocess checks confirm the real exit code.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.cli import build_parser
from infra.config import _IMAGE_TAG
from infra.config_gpu import _DNS_LABEL
from infra.config_reader import shown_key
from infra.config_schema import SCHEMA
from infra.efa_devices import mixed_efa_shares
from infra.stack import MAX_STACK_FILE_BYTES, REPO_ROOT

STACK = "hostile"
STACK_FILE = f"Pulumi.{STACK}.yaml"

POOL = {"name": "gpu-spot", "instanceTypes": ["g5.xlarge", "g6.xlarge"], "capacityType": "spot", "gpuLimit": 8,
        "zones": ["us-west-2a"], "diskSizeGiB": 200, "labels": {"team": "search"}, "weight": 10,
        "expireAfter": "720h", "consolidateAfter": "30m", "disruptionBudget": "10%", "gpusPerWorker": 1,
        "checkpointSeconds": 40}
TEAM = {"name": "search", "gpuQuota": 4}


def _base_config() -> dict[str, Any]:
    """The committed dev stack, plus a pool and a team with every field set (so each can be broken)."""
    config = dict(yaml.safe_load((REPO_ROOT / "Pulumi.dev.yaml").read_text())["config"])
    config["ragpool:gpuPools"] = [dict(POOL)]
    config["ragpool:trainingTeams"] = [dict(TEAM)]
    return config


BASE = _base_config()

# A valid value per string-like key (in the base or not) that a control character breaks.
EXEMPLAR = {
    "environment": "dev", "owner": "ml-platform", "costCenter": "rag", "vpcCidr": "10.0.0.0/16",
    "natGateways": "single", "kubernetesVersion": "1.35", "gpuAmiAlias": "al2023@latest", "imageTag": "0.1.0",
    "prometheusRetention": "31d", "redisNodeType": "cache.r7g.large", "runbookBaseUrl": "https://example.com/rb",
    "alertReceiver": "none", "deployRoleArn": "arn:aws:iam::111122223333:role/deploy",
    "availabilityZones": "us-west-2a", "publicAccessCidrs": "203.0.113.0/24", "apiAccessCidrs": "10.0.0.0/16",
    "adminRoleArns": "arn:aws:iam::111122223333:role/admin", "systemNodeInstanceTypes": "m7i.large",
}
POOL_KINDS = {"name": "string", "instanceTypes": "array", "capacityType": "string", "gpuLimit": "integer",
              "zones": "array", "diskSizeGiB": "integer", "labels": "labels", "weight": "integer",
              "expireAfter": "string", "consolidateAfter": "string", "disruptionBudget": "string",
              "gpusPerWorker": "integer", "checkpointSeconds": "integer"}
POOL_EXEMPLAR = {"name": "gpu-spot", "instanceTypes": "g5.xlarge", "capacityType": "spot", "zones": "us-west-2a",
                 "expireAfter": "720h", "consolidateAfter": "30m", "disruptionBudget": "10%"}
TEAM_KINDS = {"name": "string", "gpuQuota": "integer"}
# The secret is free text; its rules live with the receiver it belongs to.
TOP_KEYS = [k for k in SCHEMA if not k.secret]


class BigInt:
    """An integer written verbatim (safe_dump cannot print one over 4300 digits)."""

    def __init__(self, digits: int):
        self.text = "9" * digits


class _Dumper(yaml.CSafeDumper):
    pass


_Dumper.add_representer(BigInt, lambda d, v: d.represent_scalar("tag:yaml.org,2002:int", v.text))


def dump(config: Any, top: dict[str, Any] | None = None) -> bytes:
    doc = {**(top or {}), "config": config}
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=False, width=10_000).encode()


# ------------------------------------------------------------------ strategies

_controls = st.sampled_from([chr(c) for c in range(0x20)] + ["\x7f", "\r\n"])
huge_ints = st.one_of(st.integers(min_value=2**63, max_value=10**60), st.builds(BigInt, st.integers(4301, 6000)))
not_a_string = st.one_of(
    st.booleans(), st.integers(-2**70, 2**70), huge_ints, st.floats(), st.dates(),
    st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
not_an_int = st.one_of(
    st.booleans(), huge_ints, st.floats(), st.dates(), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.text(max_size=8).filter(lambda t: not t.strip().lstrip("-").isdigit()),
)
not_a_bool = st.one_of(st.integers(), huge_ints, st.floats(), st.lists(st.booleans(), max_size=2),
                       st.text(max_size=6).filter(lambda t: t.lower() not in ("true", "false")))
not_a_list = st.one_of(st.booleans(), st.integers(), huge_ints, st.floats(), st.dates(),
                       st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))


@st.composite
def with_control(draw, valid: str) -> str:
    """A valid identifier with a control character (often a trailing newline) added."""
    c = draw(_controls)
    where = draw(st.sampled_from(["end", "end", "start", "middle"]))
    if where == "end":
        return valid + c
    if where == "start":
        return c + valid
    i = draw(st.integers(1, max(1, len(valid) - 1)))
    return valid[:i] + c + valid[i:]


def bad_value(kind: str, exemplar: str | None) -> st.SearchStrategy:
    """Values that are wrong for a key of ``kind`` whatever else the stack says."""
    if kind == "string":
        return st.one_of(not_a_string, with_control(exemplar)) if exemplar else not_a_string
    if kind == "integer":
        return not_an_int
    if kind == "boolean":
        return not_a_bool
    if kind == "array":
        items = [st.lists(st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=2), max_size=1)),
                          min_size=1, max_size=3)]
        if exemplar:
            items.append(with_control(exemplar).map(lambda v: [v]))
        return st.one_of(not_a_list, *items)
    if kind == "labels":
        return st.one_of(
            not_a_list.filter(lambda v: not isinstance(v, dict)), st.lists(st.text(max_size=2), max_size=2),
            st.dictionaries(st.integers(), st.text(max_size=2), min_size=1, max_size=2),
            with_control("team").map(lambda k: {k: "search"}), with_control("search").map(lambda v: {"team": v}),
        )
    if kind == "workers":
        # rayMaxWorkers: a map of GPU pool name to workers (0..gpuLimit/gpusPerWorker); {} is valid
        most = POOL["gpuLimit"] // POOL["gpusPerWorker"]
        return st.one_of(
            not_a_list.filter(lambda v: not isinstance(v, dict)), st.lists(st.text(max_size=2), max_size=2),
            st.dictionaries(st.text(max_size=3).filter(lambda k: k != POOL["name"]), st.integers(0, most),
                            min_size=1, max_size=2),
            with_control(POOL["name"]).map(lambda k: {k: 1}),
            st.one_of(not_an_int, st.integers(max_value=-1), st.integers(min_value=most + 1)).map(
                lambda v: {POOL["name"]: v}),
        )
    if kind == "object":  # dataExport, apiTeams: one object
        return st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), min_size=1, max_size=2))
    # gpuPools / trainingTeams / dataBuckets: lists of objects
    return st.one_of(not_a_list, st.just([]) if kind == "pools" else st.nothing(),
                     st.lists(st.one_of(st.integers(), st.text(max_size=3), st.none()), min_size=1, max_size=2))


def _top_kind(key) -> str:
    if key.name == "gpuPools":
        return "pools"
    if key.name == "trainingTeams":
        return "teams"
    if key.name == "rayMaxWorkers":
        return "workers"
    if key.name == "dataBuckets":
        return "teams"  # a list of objects
    if key.name in ("dataExport", "apiTeams"):
        return "object"
    if key.type is None:
        raise AssertionError(f"{key.name}: an untyped key needs its own bad values here")
    return key.type


@st.composite
def broken_value(draw) -> tuple[bytes, str]:
    """One key anywhere in the stack (top level, a pool field, a team field, aws:region) set wrong or null."""
    config = _copy(BASE)
    target = draw(st.sampled_from(["top"] * 4 + ["pool"] * 3 + ["team", "region"]))
    null = draw(st.booleans()) and draw(st.booleans())  # a quarter: the key set to null
    if target == "top":
        key = draw(st.sampled_from(TOP_KEYS))
        value = None if null else draw(bad_value(_top_kind(key), EXEMPLAR.get(key.name)))
        config[f"ragpool:{key.name}"] = value
        return dump(config), f"ragpool:{key.name}"
    if target == "pool":
        field = draw(st.sampled_from(sorted(POOL_KINDS)))
        value = None if null else draw(bad_value(POOL_KINDS[field], POOL_EXEMPLAR.get(field)))
        config["ragpool:gpuPools"][0][field] = value
        return dump(config), f"ragpool:gpuPools[0].{field}" if field != "labels" else "ragpool:gpuPools[0].labels"
    if target == "team":
        field = draw(st.sampled_from(sorted(TEAM_KINDS)))
        value = None if null else draw(bad_value(TEAM_KINDS[field], TEAM.get(field) if field == "name" else None))
        config["ragpool:trainingTeams"][0][field] = value
        return dump(config), f"ragpool:trainingTeams[0].{field}"
    config["aws:region"] = None if null else draw(bad_value("string", "us-west-2"))
    return dump(config), "aws:region"


@st.composite
def broken_key(draw) -> tuple[bytes, str]:
    """A key that is not a string, or a ragpool key with control characters in it."""
    config = _copy(BASE)
    key = draw(st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.floats(allow_nan=False),
                         with_control("owner").map(lambda k: "ragpool:" + k)))
    config[key] = "x"
    shown = shown_key(key[len("ragpool:"):] if isinstance(key, str) else key)
    return dump(config), shown


def _bomb(width: int, depth: int) -> list:
    level: Any = "lol"
    for _ in range(depth):
        level = [level] * width  # the same list object each time: safe_dump writes anchors and aliases
    return level


def _nested(depth: int) -> list:
    level: list = []
    for _ in range(depth):
        level = [level]
    return level


@st.composite
def broken_file(draw) -> tuple[bytes, str]:
    """The file itself: alias bombs, self-referencing aliases, deep nesting, junk, bad bytes, oversize."""
    kind = draw(st.sampled_from(["bomb", "recursive", "deep", "junk", "bad-utf8", "control", "oversize",
                                 "top-not-mapping", "config-not-mapping"]))
    text = dump(_copy(BASE))
    if kind == "bomb":
        width, depth = draw(st.integers(6, 12)), draw(st.integers(6, 9))
        config = {**_copy(BASE), draw(st.sampled_from(["ragpool:owner", "ragpool:gpuPools", "x:y"])): _bomb(width, depth)}
        return dump(config), "expands to more than"
    if kind == "recursive":
        loop: list = []
        loop.append(loop)
        return dump({**_copy(BASE), "ragpool:owner": loop}), "nested more than"
    if kind == "deep":
        depth = draw(st.integers(60, 3000))
        return b"config:\n  ragpool:owner: " + b"[" * depth + b"]" * depth + b"\n", "nested more than"
    if kind == "junk":
        return draw(st.binary(min_size=1, max_size=512)), STACK_FILE
    if kind == "bad-utf8":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])) + text[i:], "not UTF-8"
    if kind == "control":
        i = draw(st.integers(0, len(text)))
        c = draw(st.sampled_from([b"\x00", b"\x01", b"\x08", b"\x0b", b"\x1b", b"\x7f"]))
        return text[:i] + c + text[i:], "not valid YAML"
    if kind == "oversize":
        return text + b"# " + b"x" * MAX_STACK_FILE_BYTES + b"\n", "larger than"
    if kind == "top-not-mapping":
        return draw(st.sampled_from([b"- a\n- b\n", b"42\n", b"just text\n", b"[config]\n", b"!!binary aGk=\n"])), "top level"
    return dump(draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=5),
                               st.booleans()))), "config must be a mapping"


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


hostile = st.one_of(broken_value(), broken_value(), broken_value(), broken_key(), broken_file())


# ------------------------------------------------------------------ the property


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stack")
    # Validation takes its defaults from SCHEMA; the project file's config: block only feeds
    # the Pulumi run, which a refused stack never reaches. A bare project file keeps an
    # example to the cost of the stack file (the real one takes ~50 ms to load each time).
    (root / "Pulumi.yaml").write_text("name: ragpool\nruntime: python\nmain: infra/\n")
    return root


_PARSER = None


def run_cli(*argv: str) -> tuple[int, str]:
    """``ragpool ARGV`` in-process (infra.cli.main with its parser built once); an exception
    escaping it, i.e. a traceback, fails the test."""
    global _PARSER
    _PARSER = _PARSER or build_parser()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        args = _PARSER.parse_args(list(argv))
        code = int(args.handler(args) or 0)
    return code, err.getvalue()


def refused_cleanly(root: Path, data: bytes, names: str, command: str) -> None:
    (root / STACK_FILE).write_bytes(data)
    plan_out = root / "plan.json"
    plan_out.unlink(missing_ok=True)
    argv = ["config", "check"] if command == "check" else ["plan", "--out", str(plan_out)]
    started = time.monotonic()
    code, err = run_cli(*argv, "--stack", STACK, "--root", str(root))
    assert code == 2, err
    assert "Traceback" not in err
    assert names in err, f"{names!r} not named in:\n{err}"
    assert all(len(line) < 4000 for line in err.splitlines()), "a value shown unbounded"
    assert not plan_out.exists()
    assert time.monotonic() - started < 10, "a hostile file must be refused quickly"


_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
           HealthCheck.large_base_example]
# Each example runs one of the two commands (both load and validate the same way).
_command = st.sampled_from(["check", "plan"])


@settings(max_examples=25, deadline=None, suppress_health_check=_HEALTH)
@given(case=hostile, command=_command)
def test_hostile_stack_files_are_refused_cleanly(root, case, command):
    refused_cleanly(root, *case, command)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=_HEALTH)
@given(case=hostile, command=_command)
def test_hostile_stack_files_are_refused_cleanly_many(root, case, command):
    """The same property over >= 1000 generated stack files (the issue's bar for the slow run)."""
    refused_cleanly(root, *case, command)


@settings(max_examples=25, deadline=None, suppress_health_check=_HEALTH)
@given(data=st.data())
def test_truncated_stack_file_is_accepted_or_refused_cleanly(root, data):
    text = dump(_copy(BASE))
    cut = data.draw(st.integers(0, len(text) - 1))
    (root / STACK_FILE).write_bytes(text[:cut])
    code, err = run_cli("config", "check", "--stack", STACK, "--root", str(root))
    assert code in (0, 2) and "Traceback" not in err
    if code == 2:
        assert STACK_FILE in err


# ------------------------------------------------------------------ valid inputs still pass


@st.composite
def valid_variation(draw) -> bytes:
    config = _copy(BASE)
    pool = config["ragpool:gpuPools"][0]
    pool["name"] = draw(st.from_regex(_DNS_LABEL, fullmatch=True))
    pool["gpuLimit"] = draw(st.integers(4, 4096))
    pool["weight"] = draw(st.integers(0, 100))
    pool["expireAfter"] = draw(st.sampled_from(["Never", "1h", "720h", "1h30m", "90s"]))
    # Types whose EFA counts per worker differ (p5.48xlarge 4, p6-b200.48xlarge 1 for one GPU) make a refused pool.
    pool["instanceTypes"] = draw(st.lists(st.sampled_from(["g5.xlarge", "g6e.12xlarge", "p5.48xlarge",
                                                            "p6-b200.48xlarge", "gr6.4xlarge"]),
                                          min_size=1, max_size=3, unique=True).filter(
        lambda types: not mixed_efa_shares(types, pool.get("gpusPerWorker", 1))))
    config["ragpool:imageTag"] = draw(st.from_regex(_IMAGE_TAG, fullmatch=True).filter(lambda t: t != "latest"))
    config["ragpool:owner"] = draw(st.from_regex(r"[a-z0-9 .:/=+@-]{1,40}", fullmatch=True))
    config["ragpool:systemNodeMinCount"] = draw(st.integers(1, 4))
    return dump(config)


@settings(max_examples=25, deadline=None, suppress_health_check=_HEALTH)
@given(data=valid_variation())
def test_valid_variations_are_accepted(root, data):
    (root / STACK_FILE).write_bytes(data)
    code, err = run_cli("config", "check", "--stack", STACK, "--root", str(root))
    assert code == 0, err


def test_base_of_the_hostile_cases_is_valid(root):
    """Every hostile case breaks exactly one thing in this stack, so it must itself pass."""
    (root / STACK_FILE).write_bytes(dump(_copy(BASE)))
    assert run_cli("config", "check", "--stack", STACK, "--root", str(root)) == (0, "")


@pytest.mark.parametrize("opening,closing", [(b"[", b"]"), (b"{a: ", b"}")], ids=["flow-list", "flow-map"])
def test_deep_nesting_is_refused_while_scanning(root, opening, closing):
    """The scanner itself refuses the 51st open level: PyYAML's scanner works per open level for each
    token, so a file of 100k ``[`` (within the size bound) would otherwise scan for hours; the
    composer's own depth check comes too late for that."""
    depth = (MAX_STACK_FILE_BYTES - 64) // (len(opening) + len(closing))
    (root / STACK_FILE).write_bytes(b"config:\n  ragpool:owner: " + opening * depth + b"1" + closing * depth + b"\n")
    code, err = run_cli("config", "check", "--stack", STACK, "--root", str(root))
    assert code == 2 and "nested more than 50 levels deep" in err, err
    # and 50 open levels are still read (the composer's bound then names the key's nesting)
    (root / STACK_FILE).write_bytes(b"config:\n  ragpool:owner: " + opening * 48 + b"1" + closing * 48 + b"\n")
    code, err = run_cli("config", "check", "--stack", STACK, "--root", str(root))
    assert code == 2 and "ragpool:owner" in err and "nested more than" not in err, err


@pytest.mark.parametrize("value,problem", [
    ({}, None),  # every pool derives its limit (a generated "bad" value once was this valid one)
    ({"gpu-spot": 0}, None),
    ({"gpu-spot": 8}, None),
    ({"gpu-spot": 9}, "ragpool:rayMaxWorkers.gpu-spot = 9: must be an integer from 0 to 8"),
    ({"gpu-spot": True}, "ragpool:rayMaxWorkers.gpu-spot = true"),
    ({"": 1}, "ragpool:rayMaxWorkers has \"\", which is not a GPU pool"),
    ({"gpu-spot\n": 1}, "ragpool:rayMaxWorkers has \"gpu-spot\\n\", which is not a GPU pool"),
    ([], "ragpool:rayMaxWorkers = []: must be a map"),
])
def test_ray_max_workers_values(root, value, problem):
    """rayMaxWorkers is untyped in Pulumi.yaml (a map): every value is judged by infra/config.py alone."""
    (root / STACK_FILE).write_bytes(dump({**_copy(BASE), "ragpool:rayMaxWorkers": value}))
    code, err = run_cli("config", "check", "--stack", STACK, "--root", str(root))
    if problem is None:
        assert (code, err) == (0, "")
    else:
        assert code == 2 and problem in err, err


# ------------------------------------------------------------------ the real CLI's exit code


@pytest.mark.parametrize("command,data,names", [
    ("plan", dump({**_copy(BASE), "ragpool:owner": _bomb(10, 9)}), ["expands to more than"]),  # 10^9 nodes
    ("check", dump({**_copy(BASE), "aws:region": ["us-west-2"], "ragpool:imageTag": "v1\n", 7: "x",
                    "ragpool:owner": None}),
     ['aws:region = ["us-west-2"]', 'ragpool:imageTag = "v1\\n"', "key 7 is not a string", "ragpool:owner is set to null"]),
], ids=["plan-alias-bomb", "check-four-classes"])
def test_real_cli_exits_2_without_traceback(tmp_path, command, data, names):
    """In the stack's directory, as a platform engineer runs it (the default --root is the current directory)."""
    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    (tmp_path / STACK_FILE).write_bytes(data)
    args = ["config", "check"] if command == "check" else ["plan", "--out", str(tmp_path / "plan.json")]
    res = subprocess.run([sys.executable, "-m", "infra.cli", *args, "--stack", STACK], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    for name in names:
        assert name in res.stderr, res.stderr
    assert not (tmp_path / "plan.json").exists()
