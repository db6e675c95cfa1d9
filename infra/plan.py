"""Offline plan: run the real Pulumi program under mocks with a stack's config.

``ragpool plan --stack dev|prod`` prints every resource the program declares as
``{"resources": [{"type", "name", "parent", "inputs", "dependsOn", ...}]}``: sorted, deterministic,
secrets masked as ``[secret]``. No cloud account, no Pulumi CLI, no state.
``ragpool plan-diff OLD.json NEW.json`` summarises what changes between two plans,
with Helm values and Kubernetes objects as YAML diffs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.config import StackConfigError
from infra.config_schema import PROJECT
from infra.langhost.mock_exec import PLACEHOLDER_SECRET, Recorded, make_mocks, make_monitor, run_under_mocks, unwrap
from infra.langhost.mock_exec import MOCK_ACCOUNT, mock_outputs  # noqa: F401  (tests read them here)
from contract import exit_codes
from contract.messages import shown
from infra.stack import DEFAULT_REGION, REPO_ROOT, StackSettings, load_stack, validate_stack

INFRA_DIR = Path(__file__).resolve().parent
SECRET_MASK = "[secret]"


# ------------------------------------------------------------------ running the program

# The mocks live with the language-host stand-in, which may import nothing but pulumi.
_make_mocks, _make_monitor = make_mocks, make_monitor
_unwrap = unwrap
MOCK_EXEC = INFRA_DIR / "langhost" / "mock_exec.py"
# A plan takes a few seconds; this bounds a program that hangs (an apply waiting forever).
PROGRAM_TIMEOUT_S = 300


class ProgramError(Exception):
    """The program failed (not a config error): its traceback, as the Pulumi CLI would show it."""


def _mask(value: Any, secret_values: tuple[str, ...]) -> Any:
    from pulumi.runtime import rpc

    if rpc.is_rpc_secret(value):
        return _mask_leaves(_unwrap(value))
    if isinstance(value, dict):
        return {k: _mask(v, secret_values) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_mask(v, secret_values) for v in value]
    if isinstance(value, str):
        return SECRET_MASK if any(s and s in value for s in secret_values) else value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # protobuf Struct carries every number as a double
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def _mask_leaves(value: Any) -> Any:
    """Secretness reaches maps and lists whole: keep their shape, hide every value."""
    if isinstance(value, dict):
        return {k: _mask_leaves(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_mask_leaves(v) for v in value]
    return SECRET_MASK


def run_program(settings: StackSettings, program: Path = INFRA_DIR) -> list[Recorded]:
    """Run ``program`` (a directory with __main__.py, as `main:` in Pulumi.yaml) under mocks, in this
    interpreter: for tests that patch the mocks or the program's modules. Whatever this process
    imported before stays imported, which can hide what the language host would hit: ``plan``
    uses :func:`run_program_as_host`."""
    return run_under_mocks(str(program), project=PROJECT, stack=settings.stack, region=settings.region or DEFAULT_REGION,
                           config=dict(settings.engine_config), secret_keys=list(settings.secret_keys),
                           monitor_factory=_make_monitor)


@dataclass(frozen=True)
class HostRun:
    recorded: list[Recorded]
    preloaded: tuple[str, ...]  # modules imported before run_path


def run_program_as_host(settings: StackSettings, program: Path = INFRA_DIR,
                        env: dict[str, str] | None = None) -> HostRun:
    """Run ``program`` under mocks the way Pulumi's Python language host runs it: a fresh interpreter
    running infra/langhost/mock_exec.py by path, which imports only pulumi, chdirs to the program
    directory and calls ``runpy.run_path(".", run_name="__main__")``.

    ``pulumi.RunError`` from the program (bad config) raises StackConfigError; any other failure
    raises ProgramError with the program's traceback."""
    import subprocess
    import tempfile

    request = {"program": str(Path(program).resolve()), "package_root": str(INFRA_DIR.parent),
               "project": PROJECT, "stack": settings.stack,
               "region": settings.region or DEFAULT_REGION, "config": dict(settings.engine_config),
               "secret_keys": list(settings.secret_keys)}
    with tempfile.TemporaryDirectory(prefix="ragpool-plan-") as tmp:
        result_path = Path(tmp) / "result.json"
        try:
            proc = subprocess.run([sys.executable, str(MOCK_EXEC), str(result_path)], input=json.dumps(request),
                                  capture_output=True, text=True, cwd=tmp, env=env, timeout=PROGRAM_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            seen = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            raise ProgramError(f"the program did not finish within {PROGRAM_TIMEOUT_S} s; its last output:\n"
                               f"{seen[-4000:]}") from None
        if proc.returncode != 0 or not result_path.is_file():
            raise ProgramError(f"the program failed (exit {proc.returncode}) as the Pulumi language host runs it:\n"
                               f"{proc.stderr[-8000:]}")
        result = json.loads(result_path.read_text())
    sys.stderr.write(proc.stderr)  # the program's warnings, as `pulumi up` would show them
    if "run_error" in result:
        # The program refuses the config (infra/__main__.py turns StackConfigError into RunError
        # so `pulumi up` prints no traceback); here it is bad input like any other.
        raise StackConfigError([result["run_error"]], source=settings.stack_file.name)
    return HostRun(recorded=[Recorded(**r) for r in result["recorded"]], preloaded=tuple(result["preloaded"]))


def urn_key(urn: str) -> str:
    """``urn:pulumi:<stack>::<project>::<parent$...$type>::<name>`` -> ``<type>::<name>``."""
    parts = urn.split("::")
    return f"{parts[2].rsplit('$', 1)[-1]}::{parts[-1]}" if len(parts) >= 4 else urn


def _short_parent(urn: str) -> str | None:
    # urn:pulumi:<stack>::<project>::<parent types joined by $>::<name>
    if not urn or urn.split("::")[2] == "pulumi:pulumi:Stack":
        return None
    return urn.rsplit("::", 1)[-1]


def render_plan(settings: StackSettings, recorded: list[Recorded]) -> dict[str, Any]:
    resources = []
    for r in recorded:
        entry: dict[str, Any] = {"type": r.type, "name": r.name, "parent": _short_parent(r.parent_urn),
                                 "inputs": _mask(r.inputs, settings.secret_values + (PLACEHOLDER_SECRET,))}
        if r.protect:
            entry["protect"] = True
        if r.retain_on_delete:
            entry["retainOnDelete"] = True
        if r.aliases:
            entry["aliases"] = sorted(r.aliases)
        if r.dependencies:
            # What the engine waits for before creating this resource, as "type::name".
            entry["dependsOn"] = sorted({urn_key(u) for u in r.dependencies})
        resources.append(entry)
    resources.sort(key=lambda e: (e["type"], e["name"]))
    return {"project": PROJECT, "stack": settings.stack, "resources": resources}


def plan(stack: str, root: Path = REPO_ROOT, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate the stack's config, run the program under mocks as the language host does, return the
    plan document."""
    settings = load_stack(stack, root, overrides)
    validate_stack(settings)
    return render_plan(settings, run_program_as_host(settings).recorded)


# ------------------------------------------------------------------ rendering


def _dump_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def render_tree(doc: dict[str, Any]) -> str:
    children: dict[str | None, list[dict[str, Any]]] = {}
    for r in doc["resources"]:
        children.setdefault(r["parent"], []).append(r)
    lines = [f"{doc['project']}-{doc['stack']}: {len(doc['resources'])} resources"]

    def walk(parent: str | None, depth: int) -> None:
        for r in sorted(children.get(parent, []), key=lambda e: (e["type"].startswith("ragpool:"), e["name"])):
            flags = "".join([" [protect]" if r.get("protect") else "", " [retain]" if r.get("retainOnDelete") else ""])
            lines.append(f"{'  ' * depth}{'+-' if depth else ''}{r['name']} ({r['type']}){flags}")
            walk(r["name"], depth + 1)

    walk(None, 0)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ diff

def _yaml(value: Any) -> list[str]:
    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False, width=100).splitlines()


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _json_docs_parsed(value: Any) -> Any:
    """``value`` with every string holding a JSON object (a rendered dashboard in a ConfigMap, a policy
    document) replaced by that object, so a YAML diff shows its changed fields instead of escaped text."""
    if isinstance(value, dict):
        return {k: _json_docs_parsed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_docs_parsed(v) for v in value]
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            doc = json.loads(value)
        except ValueError:
            return value
        return _json_docs_parsed(doc) if isinstance(doc, dict) else value
    return value


def _yaml_diff(path: str, a: Any, b: Any) -> list[str]:
    import difflib

    a, b = _json_docs_parsed(a), _json_docs_parsed(b)
    body = list(difflib.unified_diff(_yaml(a), _yaml(b), lineterm="", n=2))[2:]
    return [f"    ~ {path}:"] + [f"        {ln}" for ln in body]


def _leaf_diff(path: str, a: Any, b: Any, missing: Any) -> list[str]:
    """Dotted-path changes for maps (tags, configs); YAML diffs for nested lists."""
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _leaf_diff(f"{path}.{k}", a.get(k, missing), b.get(k, missing), missing)
        return out
    if a is missing:
        return [f"    + {path}: {json.dumps(b, sort_keys=True)}" if _is_scalar(b) else f"    + {path}:"] + (
            [] if _is_scalar(b) else [f"        {ln}" for ln in _yaml(b)])
    if b is missing:
        return [f"    - {path}"]
    if _is_scalar(a) and _is_scalar(b):
        return [f"    ~ {path}: {json.dumps(a)} => {json.dumps(b)}"]
    return _yaml_diff(path, a, b)


def _diff_inputs(old: dict[str, Any], new: dict[str, Any], whole_yaml: bool) -> list[str]:
    missing = object()
    lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a == b:
            continue
        if whole_yaml and a is not missing and b is not missing and not (_is_scalar(a) and _is_scalar(b)):
            # Helm values and Kubernetes objects read best as one YAML diff (pulumi-kubernetes #1701).
            lines += _yaml_diff(key, a, b)
        else:
            lines += _leaf_diff(key, a, b, missing)
    return lines


def _whole_yaml(rtype: str) -> bool:
    return rtype.startswith("kubernetes:")


MAX_DIFF_LINES_PER_RESOURCE = 60
"""A changed resource shows at most this many diff lines in ``plan-diff`` (a rendered dashboard or a values
file can change by thousands); the rest is counted, and ``plan-diff --full`` shows everything."""


def _capped(lines: list[str], limit: int | None) -> list[str]:
    if limit is None or len(lines) <= limit:
        return lines
    return lines[:limit] + [f"    ... {len(lines) - limit} more changed lines (`ragpool plan-diff --full OLD NEW` "
                            "shows them)"]


def plan_diff(old: dict[str, Any], new: dict[str, Any], common_threshold: int = 4,
              max_lines: int | None = MAX_DIFF_LINES_PER_RESOURCE) -> str:
    """What changes from ``old`` to ``new``; each changed resource's lines capped at ``max_lines`` (None: all)."""
    key = lambda r: (r["type"], r["name"])  # noqa: E731
    a = {key(r): r for r in old["resources"]}
    b = {key(r): r for r in new["resources"]}
    added = sorted(set(b) - set(a))
    removed = sorted(set(a) - set(b))
    per_resource: dict[tuple[str, str], list[str]] = {}
    for k in sorted(set(a) & set(b)):
        ra, rb = a[k], b[k]
        lines = [f"    ~ [{opt}]: {ra.get(opt, False)} => {rb.get(opt, False)}"
                 for opt in ("protect", "retainOnDelete") if ra.get(opt, False) != rb.get(opt, False)]
        lines += _diff_inputs(ra["inputs"], rb["inputs"], _whole_yaml(k[0]))
        if ra.get("parent") != rb.get("parent"):
            lines.append(f"    ~ [parent]: {ra.get('parent')} => {rb.get('parent')}")
        if lines:
            per_resource[k] = lines

    # A change repeated on many resources (a new tag value, a renamed prefix) is said once.
    counts: dict[str, int] = {}
    for lines in per_resource.values():
        for ln in set(lines):
            if ln.startswith("    ~ ") and not ln.rstrip().endswith(":"):
                counts[ln] = counts.get(ln, 0) + 1
    common = sorted(ln for ln, n in counts.items() if n >= common_threshold)

    title = f"{old.get('project', PROJECT)}-{old.get('stack', '?')} -> {new.get('project', PROJECT)}-{new.get('stack', '?')}"
    out = [f"Plan diff {title}: {len(added)} to add, {len(per_resource)} to change, {len(removed)} to remove"]

    def group(keys: list[tuple[str, str]]) -> dict[str, list[str]]:
        by_type: dict[str, list[str]] = {}
        for t, n in keys:
            by_type.setdefault(t, []).append(n)
        return by_type

    if added:
        out.append("\nAdded:")
        out += [f"  + {t} ({len(n)}): {', '.join(n)}" for t, n in group(added).items()]
    if removed:
        out.append("\nRemoved:")
        out += [f"  - {t} ({len(n)}): {', '.join(n)}" for t, n in group(removed).items()]
    if common:
        out.append("\nChanged on many resources:")
        out += [f"  {ln.strip()}   ({counts[ln]} resources)" for ln in common]
    rest = {k: [ln for ln in lines if ln not in common] for k, lines in per_resource.items()}
    rest = {k: v for k, v in rest.items() if v}
    if rest:
        out.append("\nChanged:")
        for k, lines in rest.items():
            out.append(f"  ~ {k[1]} ({k[0]})")
            out += _capped(lines, max_lines)
    only_common = sorted(set(per_resource) - set(rest))
    if only_common:
        out.append(f"\nOnly the common changes above: {', '.join(n for _, n in only_common)}")
    if not (added or removed or per_resource):
        out.append("No changes.")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ CLI


def _fail(prog: str, exc: Exception | str) -> int:
    print(f"{prog}: {exc}", file=sys.stderr)
    return exit_codes.BAD_INPUT


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        doc = plan(args.stack, Path(args.root))
    except StackConfigError as exc:
        return _fail("ragpool plan", exc)
    except ProgramError as exc:
        print(f"ragpool plan: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    if args.out:
        try:
            Path(args.out).write_text(_dump_json(doc))
        except OSError as exc:
            return _fail("ragpool plan", f"cannot write --out {shown(args.out, 200)}: {exc.strerror or exc}")
    sys.stdout.write(_dump_json(doc) if args.format == "json" else render_tree(doc))
    return 0


def cmd_plan_diff(args: argparse.Namespace) -> int:
    docs = []
    for path in (args.old, args.new):
        try:
            doc = json.loads(Path(path).read_text())
            if not isinstance(doc, dict) or not isinstance(doc.get("resources"), list):
                raise ValueError("not a ragpool plan (no resources list)")
            docs.append(doc)
        except (OSError, ValueError) as exc:
            print(f"ragpool plan-diff: {path}: {exc}", file=sys.stderr)
            return exit_codes.BAD_INPUT
    sys.stdout.write(plan_diff(*docs, max_lines=None if args.full else MAX_DIFF_LINES_PER_RESOURCE))
    return 0


def add_root_argument(parser: argparse.ArgumentParser) -> None:
    """--root, defaulting to the current directory as the Pulumi CLI does."""
    parser.add_argument("--root", default=".",
                        help="directory holding Pulumi.yaml and Pulumi.<stack>.yaml (default: the current directory)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="offline plan of a stack (Pulumi program under mocks, no cloud)")
    p.add_argument("--stack", required=True, help="stack name, e.g. dev or prod (reads Pulumi.<stack>.yaml)")
    p.add_argument("--format", choices=("json", "tree"), default="json")
    p.add_argument("--out", help="also write the JSON plan to this file")
    add_root_argument(p)
    p.set_defaults(handler=cmd_plan)
    d = sub.add_parser("plan-diff", help="what changes between two JSON plans, for reviewers")
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--full", action="store_true",
                   help=f"every changed line (default: at most {MAX_DIFF_LINES_PER_RESOURCE} per resource)")
    d.set_defaults(handler=cmd_plan_diff)
