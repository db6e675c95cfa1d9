"""The project's own source folders, for the checks that scan every file of them (a literal port, an exit
code written as a number, an import across the planes)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("contract", "infra", "training", "policy", "dashboards", "bench")
"""Top-level folders of the project's code (``scripts/`` and ``tests/`` are tools around it)."""
