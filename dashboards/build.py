"""Render every ragpool dashboard to ``<out>/<stem>.json``.

Deterministic: keys sorted, two-space indent, trailing newline, no timestamps or ids that
vary between runs, so a rebuild of unchanged code is byte-identical.

    ragpool dashboards --out DIR      # or: python -m dashboards.cli --out DIR (dashboards/cli.py)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards.boards import ALL, PER_LANE
from contract.lanes import Lane


def to_dict(board: Any) -> dict[str, Any]:
    """The dashboard as plain JSON data (what Grafana imports)."""
    return json.loads(json.dumps(board, cls=JSONEncoder))


def render(board: Any) -> str:
    """Deterministic JSON text of one dashboard."""
    return json.dumps(to_dict(board), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def render_all(lanes: Sequence[Lane] | None = None) -> dict[str, str]:
    """File name -> JSON text for every dashboard, checking UIDs are unique. ``lanes``: the stack's
    lanes, one row each on the boards of :data:`~dashboards.boards.PER_LANE` (None: their default)."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for stem, build in ALL.items():
        board = build(lanes) if lanes is not None and stem in PER_LANE else build()
        uid = board.uid
        if not uid:
            raise ValueError(f"dashboard {stem!r} has no uid")
        if uid in seen:
            raise ValueError(f"dashboards {seen[uid]!r} and {stem!r} share uid {uid!r}")
        seen[uid] = stem
        out[f"{stem}.json"] = render(board)
    return out


def write_all(out_dir: Path, lanes: Sequence[Lane] | None = None) -> list[Path]:
    """Write every dashboard under ``out_dir`` (created if missing); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(lanes).items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
