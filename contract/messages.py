"""How an error message quotes a value someone wrote: the one ``shown`` of ragpool.

Stack config (infra/), run configs and run specs (training/), the queue's settings and the CLIs
all quote a bad value with it, so a message looks the same wherever it comes from: JSON-like (a
YAML user reads back what they wrote), control characters escaped, at most ``limit`` characters.
Torch-free and dependency-free (tests/training/test_torch_boundary.py), so infra/ imports it.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

#: Longest text of one value quoted in an error message.
MAX_SHOWN = 120


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``value`` as an error message quotes it: JSON-like, control characters escaped, at most ``limit`` characters.

    Bounded in time too: a value that shares sub-lists (a YAML alias bomb) is walked only
    until the text is full, and a huge integer is described rather than converted.
    """
    out: list[str] = []
    used = 0

    class _Full(Exception):
        pass

    def emit(text: str) -> None:
        nonlocal used
        out.append(text)
        used += len(text)
        if used > limit:
            raise _Full

    def walk(v: Any, depth: int) -> None:
        if depth > 32:
            emit("...")
            raise _Full
        if isinstance(v, Mapping):
            emit("{")
            for i, (k, x) in enumerate(v.items()):
                emit(", " if i else "")
                walk(k, depth + 1)
                emit(": ")
                walk(x, depth + 1)
            emit("}")
        elif isinstance(v, (list, tuple)):
            emit("[")
            for i, x in enumerate(v):
                emit(", " if i else "")
                walk(x, depth + 1)
            emit("]")
        elif v is None or isinstance(v, (bool, float)):
            emit(json.dumps(v))
        elif isinstance(v, int):
            emit(str(v) if v.bit_length() <= 256 else f"<{v.bit_length()}-bit integer>")
        elif isinstance(v, str):
            emit(json.dumps(v[:limit + 1]))
        else:  # a YAML date, binary, set...: its text unquoted, so it does not read as a string
            emit(json.dumps(str(v)[:limit + 1])[1:-1])

    try:
        walk(value, 0)
    except _Full:
        pass
    text = "".join(out)
    return text if len(text) <= limit else text[:limit] + "...(truncated)"
