"""A stack file: read it as the Pulumi CLI would, and validate it.

``Pulumi.<stack>.yaml`` beside ``Pulumi.yaml``: :func:`load_stack` reads both (bounded: a hostile file
cannot cost more than a few hundred kilobytes and a few thousand YAML nodes) into what the engine would
hand the program, and :func:`validate_stack` parses its ``ragpool:`` keys with infra/config.py, reporting
every problem at once. ``ragpool plan`` (infra/plan.py) and ``ragpool config check`` (infra/config_check.py)
start here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contract.messages import shown
from infra.config import StackConfig, StackConfigError, parse
from infra.config_schema import PROJECT
from infra.efa_devices import check_efa_pools
from infra.langhost.mock_exec import PLACEHOLDER_SECRET

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REGION = "us-west-2"

# What a stack or project file may cost to read. Real ones are a few kilobytes; these
# bound a hostile or broken one (a huge file, /dev/zero behind a symlink, a YAML alias
# bomb whose few hundred bytes expand to 10^9 nodes, nesting that would overflow the stack).
MAX_STACK_FILE_BYTES = 256 * 1024
MAX_YAML_NODES = 20_000  # counted with every alias expanded
MAX_YAML_DEPTH = 50
# Pulumi's stack-name rule (alphanumerics, hyphens, underscores, periods; at most 100).
_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


@dataclass(frozen=True)
class StackSettings:
    """A stack's config as the Pulumi engine would hand it to the program."""

    stack: str
    engine_config: dict[str, str]  # "ns:key" -> wire value (str / JSON text)
    secret_keys: tuple[str, ...]
    raw: dict[str, Any]  # ragpool keys (no namespace) -> native value, stack overrides only
    region: str | None
    stack_file: Path
    secret_values: tuple[str, ...] = field(default=(), repr=False)


def _wire(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, default=str)  # YAML dates, sets, bytes: as text, for parse() to refuse


class _TooBig(Exception):
    pass


_TOO_DEEP = f"is nested more than {MAX_YAML_DEPTH} levels deep"


class UnreadableNumber:
    """Stands in for an integer too long for Python to read (over 4300 digits), so the
    key that holds it is named by validation instead of failing the whole file."""

    def __init__(self, digits: int):
        self.digits = digits

    def __str__(self) -> str:
        return f"<integer of {self.digits} digits>"


class _StackLoader(yaml.SafeLoader):
    """SafeLoader whose scalars never raise ValueError: too-long integers become
    UnreadableNumber, impossible dates (2024-13-45) stay the text they are; and whose scanner
    refuses nesting past MAX_YAML_DEPTH as it reads (PyYAML's scanner does work per open flow
    level for every token, so 3000 ``[`` took seconds before the composer's depth check could run)."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        if self.flow_level >= MAX_YAML_DEPTH:
            raise _TooBig(_TOO_DEEP)
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) >= MAX_YAML_DEPTH:
            raise _TooBig(_TOO_DEEP)
        return super().add_indent(column)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return UnreadableNumber(len(node.value))

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError:
            return node.value


_StackLoader.add_constructor("tag:yaml.org,2002:int", _StackLoader.construct_yaml_int)
_StackLoader.add_constructor("tag:yaml.org,2002:timestamp", _StackLoader.construct_yaml_timestamp)


def _expanded_size(node: yaml.Node, depth: int, memo: dict[int, int]) -> int:
    """Nodes under ``node`` with every alias expanded, without expanding them; _TooBig past the bounds."""
    if depth > MAX_YAML_DEPTH:
        raise _TooBig(f"{_TOO_DEEP} (or has an alias that refers to itself)")
    if id(node) in memo:
        return memo[id(node)]
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1
    for child in children:
        size += _expanded_size(child, depth + 1, memo)
        if size > MAX_YAML_NODES:
            raise _TooBig(f"expands to more than {MAX_YAML_NODES} YAML nodes (aliases counted where used); "
                          "a stack file holds a few dozen settings")
    memo[id(node)] = size
    return size


def _plain(text: str, limit: int = 200) -> str:
    """Text from a parser for a one-line message: control characters escaped, bounded."""
    return json.dumps(text[:limit])[1:-1] + ("..." if len(text) > limit else "")


def read_yaml_file(path: Path) -> Any:
    """Parse a Pulumi project or stack file, bounded in bytes, expansion and depth; StackConfigError otherwise."""

    def fail(problem: str) -> StackConfigError:
        return StackConfigError([problem], source=path.name)

    try:
        with path.open("rb") as f:
            data = f.read(MAX_STACK_FILE_BYTES + 1)
    except OSError as exc:
        raise fail(f"the file cannot be read: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_STACK_FILE_BYTES:
        raise fail(f"the file is larger than {MAX_STACK_FILE_BYTES} bytes; a stack file holds a few kilobytes of settings")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"the file is not UTF-8 text (byte {exc.start} is {data[exc.start:exc.start + 1]!r}); "
                   "save it as UTF-8") from None
    loader = None
    try:
        loader = _StackLoader(text)  # refuses control characters here
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, 0, {})
        return loader.construct_document(node)
    except _TooBig as exc:
        raise fail(f"the file {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (f" at line {mark.line + 1}, column {mark.column + 1}" if mark else
                 f" at character {exc.position}" if isinstance(exc, yaml.reader.ReaderError) else "")
        what = (getattr(exc, "problem", None) or str(exc)).splitlines()[0]
        raise fail(f"the file is not valid YAML{where}: {_plain(what)}") from None
    except RecursionError:
        raise fail(f"the file {_TOO_DEEP}") from None
    except ValueError as exc:  # a scalar YAML resolves but Python refuses, e.g. a 5000-digit integer
        raise fail(f"the file holds a value that cannot be read: {_plain(str(exc).split(';')[0])}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _config_block(path: Path, doc: Any) -> dict[Any, Any]:
    """The ``config:`` mapping of a project or stack file (empty when absent)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise StackConfigError([f"the top level must be a mapping with a config: section, not {shown(doc, 60)}"],
                          source=path.name)
    block = doc.get("config")
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise StackConfigError([f"config must be a mapping of `namespace:key: value` lines, not {shown(block, 60)}"],
                          source=path.name)
    return block


def load_stack(stack: str, root: Path = REPO_ROOT, overrides: dict[str, Any] | None = None) -> StackSettings:
    """Read Pulumi.yaml defaults and Pulumi.<stack>.yaml overrides (plus ``overrides``).

    Problems with the files themselves (unreadable, too large, not UTF-8, not YAML, not a
    mapping) raise StackConfigError here; problems with values (wrong types, nulls, non-string
    keys) are left to :func:`validate_stack`, which reports them all at once.
    """
    if not (isinstance(stack, str) and _STACK_NAME.fullmatch(stack)):
        raise StackConfigError([f"stack name {shown(stack, 60)} may only contain alphanumerics, hyphens, underscores "
                           "and periods (at most 100)"], source="stack name")
    project_file = root / "Pulumi.yaml"
    stack_file = root / f"Pulumi.{stack}.yaml"
    if not project_file.is_file():
        raise StackConfigError([f"no Pulumi.yaml in {shown(str(root.absolute()), 200)}: run in the project directory "
                           "(like the Pulumi CLI) or pass --root"], source=f"stack {stack}")
    if not stack_file.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
        raise StackConfigError([f"no stack file {stack_file.name}; stacks here: {', '.join(known) or 'none'}"],
                          source=f"stack {stack}")
    project_config = _config_block(project_file, read_yaml_file(project_file))
    values = dict(_config_block(stack_file, read_yaml_file(stack_file)))
    values.update(overrides or {})

    engine: dict[str, str] = {}
    for key, decl in project_config.items():
        if isinstance(key, str) and isinstance(decl, dict) and "default" in decl:
            engine[key if ":" in key else f"{PROJECT}:{key}"] = _wire(decl["default"])
    secret_keys, secret_values, raw = [], [], {}
    region = None
    for key, value in values.items():
        if not isinstance(key, str):
            raw[key] = value  # parse() names it: config keys are strings
            continue
        full = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            value = PLACEHOLDER_SECRET
            secret_keys.append(full)
        engine[full] = _wire(value)
        if full.startswith(PROJECT + ":"):
            raw[full[len(PROJECT) + 1:]] = value
        if full == "aws:region":
            region = value
        if full in secret_keys:
            secret_values.append(engine[full])
    return StackSettings(stack=stack, engine_config=engine, secret_keys=tuple(secret_keys), raw=raw,
                         region=region, stack_file=stack_file, secret_values=tuple(secret_values))


def validate_stack(settings: StackSettings) -> StackConfig:
    """Validate the stack overrides (defaults filled by the schema), then the pools' EFA counts
    (infra/efa_devices.py check_efa_pools); StackConfigError on problems."""
    source = settings.stack_file.name
    return check_efa_pools(parse(settings.raw, stack=settings.stack, region=settings.region, source=source), source)
