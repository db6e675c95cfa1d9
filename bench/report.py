"""How a benchmark ends (one home for every bench's last lines): bad arguments refused with exit 2
and nothing measured, else the figures as one JSON line last, and the exit code from its goals."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from contract import exit_codes


def finish(prog: str, problems: list[str], measure: Callable[[], dict[str, Any]]) -> int:
    """``problems`` (bad arguments) -> one line on stderr naming ``prog``, exit 2 (BAD_INPUT);
    otherwise ``measure()``'s figures printed as one JSON line, exit 0 when every ``goals`` entry
    holds, else 1."""
    if problems:
        print(f"{prog}: " + "; ".join(problems), file=sys.stderr)
        return exit_codes.BAD_INPUT
    figures = measure()
    print(json.dumps(figures, sort_keys=True), flush=True)
    return 0 if all(figures["goals"].values()) else 1
