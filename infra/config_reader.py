"""Reading raw ``ragpool:`` values against the schema: decode Pulumi's wire form, record each problem.

:class:`Reader` hands each key's value (a Pulumi string or JSON text, or a native YAML value) decoded to its
declared type, or its default, and collects one line per problem naming the key, the value and what is
allowed; infra/config.py and infra/config_gpu.py check values through it and raise them all at once.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from contract.messages import shown
from infra.config_schema import PROJECT, SCHEMA_BY_NAME, ConfigKey


def shown_key(key: Any) -> str:
    """A config key as a message names it: verbatim when it is a plain identifier, else quoted like a value."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_.:/\[\]-]{1,100}", key):
        return key
    return shown(key, 60)


class Reader:
    """Decodes raw values (Pulumi strings/JSON or native YAML) and records problems."""

    def __init__(self, raw: Mapping[str, Any]):
        self.raw = raw
        self.problems: list[str] = []

    def problem(self, key: str, value: Any, allowed: str) -> None:
        text = "[secret]" if key in SCHEMA_BY_NAME and SCHEMA_BY_NAME[key].secret else shown(value)
        self.problems.append(f"{PROJECT}:{key} = {text}: {allowed}")

    def get(self, key: str) -> Any:
        decl = SCHEMA_BY_NAME[key]
        if key in self.raw and self.raw[key] is None:
            # `key: null` (or `key:` with nothing after it) is a slip, not a request for the default.
            fix = f"pulumi config set {'--secret ' if decl.secret else ''}{key} VALUE"
            if not decl.required:
                fix += ", or delete the line" + ("" if decl.default is None else f" for the default {shown(decl.default)}")
            self.problems.append(f"{PROJECT}:{key} is set to null: give it a value (fix: {fix})")
            return decl.default
        if key not in self.raw:
            if decl.required:
                self.problems.append(
                    f"{PROJECT}:{key} is required but not set: {decl.description} "
                    f"(fix: pulumi config set {'--secret ' if decl.secret else ''}{key} VALUE)"
                )
            return decl.default
        value = self.raw[key]
        try:
            return decode(decl, value)
        except ValueError as exc:
            self.problem(key, value, str(exc))
            return decl.default


def decode(decl: ConfigKey, value: Any) -> Any:
    """``value`` as ``decl``'s type (from Pulumi's wire form or a native YAML value); ValueError saying what is allowed."""
    if decl.type == "string":
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return value
    if decl.type == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError("must be true or false")
    if decl.type == "integer":
        if isinstance(value, bool):
            raise ValueError("must be an integer")
        if isinstance(value, int) and abs(value) < 2**63:
            return value
        if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value.strip()):
            return int(value)
        raise ValueError("must be an integer (at most 18 digits)")
    # arrays and objects arrive from the Pulumi engine as JSON text
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"must be valid {'a list' if decl.type == 'array' else 'structured'} value ({exc.msg})") from None
        except RecursionError:
            raise ValueError("is nested too deeply") from None
    if decl.type == "array":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a list of strings")
    return value


def check(ok: bool, r: Reader, key: str, value: Any, allowed: str) -> bool:
    """Record on ``r`` that ``key = value`` breaks ``allowed`` unless ``ok``; returns ``ok``."""
    if not ok:
        r.problem(key, value, allowed)
    return ok


def is_int(value: Any, lo: int, hi: int) -> bool:
    """An integer (not a bool) from ``lo`` to ``hi``."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
