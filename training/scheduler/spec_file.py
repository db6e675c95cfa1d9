"""Reading a run spec from a file or text, hostile input included: the bytes, the encoding, the syntax.

A spec file is read up to :data:`~training.scheduler.spec.MAX_SPEC_BYTES` (+1 to detect more; ``/dev/zero`` or
a FIFO cannot exhaust memory), must be UTF-8, YAML anchors and aliases are refused (no alias bombs), nesting is
bounded by :data:`MAX_SPEC_DEPTH`, and a syntax error's message is cut short. The mapping it gives is then
validated by ``spec.parse_spec`` (every field, ``spec.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from training.scheduler.spec import MAX_SPEC_BYTES, RunSpec, SpecError, parse_spec

MAX_SPEC_DEPTH = 32
"""Deepest nesting of mappings and lists a spec file may have (a real spec needs 5)."""
_MAX_MESSAGE_CHARS = 300


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing anchors and aliases (a 600-byte alias bomb would expand to
    10^9 nodes once walked) and nesting deeper than :data:`MAX_SPEC_DEPTH`."""

    _depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.MarkedYAMLError(problem="anchors (&name) and aliases (*name) are not accepted in a run spec",
                                       problem_mark=event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_SPEC_DEPTH:
                raise yaml.MarkedYAMLError(problem=f"nested deeper than {MAX_SPEC_DEPTH} levels",
                                           problem_mark=event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."


def _depth(value: Any, limit: int = MAX_SPEC_DEPTH) -> int:
    """Nesting depth of ``value``, counting no further than ``limit`` + 1."""
    if limit < 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def parse_spec_text(text: str, *, source: str = "run spec", fmt: str | None = None,
                    shared_root: str | None = None, environ: Mapping[str, str] | None = None) -> RunSpec:
    """Parse YAML or JSON text (``fmt`` = ``json``/``yaml``; guessed from the first character otherwise)."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_SPEC_BYTES:
        raise SpecError([("(file)", f"{size} bytes; the limit is {MAX_SPEC_BYTES}")], source)
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "yaml")
    try:
        if fmt == "json":
            raw = json.loads(text)
            if _depth(raw) > MAX_SPEC_DEPTH:
                raise SpecError([("(syntax)", f"nested deeper than {MAX_SPEC_DEPTH} levels")], source)
        else:
            raw = yaml.load(text, Loader=SpecLoader)  # a SafeLoader subclass
    except SpecError:
        raise
    except json.JSONDecodeError as exc:
        raise SpecError([("(syntax)", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")],
                        source) from None
    except RecursionError:
        raise SpecError([("(syntax)", f"nested deeper than {MAX_SPEC_DEPTH} levels")], source) from None
    except Exception as exc:  # yaml.YAMLError carries the line; ValueError: an int past the digit limit
        raise SpecError([("(syntax)", _bounded(f"invalid {fmt.upper()}: {exc}"))], source) from None
    return parse_spec(raw, source=source, shared_root=shared_root, environ=environ)


def read_spec_text(path: str | os.PathLike) -> str:
    """The text of a spec file, read no further than :data:`MAX_SPEC_BYTES` + 1 bytes (so
    ``/dev/zero`` or a FIFO cannot exhaust memory), as strict UTF-8."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError([("(file)", f"cannot read: {exc.strerror}")], source) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([("(file)", f"more than {MAX_SPEC_BYTES} bytes; the limit is {MAX_SPEC_BYTES}")], source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([("(file)", f"not UTF-8 text (byte {exc.start}: {exc.reason})")], source) from None


def load_spec(path: str | os.PathLike, *, shared_root: str | None = None) -> RunSpec:
    """Read and validate a ``.yaml``/``.yml``/``.json`` run spec file."""
    text = read_spec_text(path)
    fmt = "json" if Path(path).suffix.lower() == ".json" else "yaml"
    return parse_spec_text(text, source=str(path), fmt=fmt, shared_root=shared_root)
