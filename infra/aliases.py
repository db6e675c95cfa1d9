"""Renamed and moved components, recorded so `pulumi up` keeps existing resources.

``infra/component.py`` (``RagpoolComponent``, every component's base) reads ``MOVES``.

Renaming or retyping a component would otherwise change its URN (and, for a retype,
every child's URN, which embeds the parent's type): Pulumi would delete and recreate
the cluster, the file system and the queue. To rename, change the name in
``infra/__main__.py`` and add an entry here; to change a component's type token, add
its old type. Children keep their names (a child's URN holds its parent's type, not its
name) and inherit the component's alias for a retype, so nothing is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Moved:
    """What a component was called before (None: unchanged)."""

    old_name: str | None = None
    old_type: str | None = None


# (type token, current name) -> previous identity. Empty until something moves.
MOVES: dict[tuple[str, str], Moved] = {}
