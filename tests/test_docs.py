"""docs/DESIGN.md and docs/TESTING.md stay true: every path they name exists; DESIGN lists every component and room."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = (REPO / "docs" / "DESIGN.md").read_text()
TESTING = (REPO / "docs" / "TESTING.md").read_text()


def _named_paths(text: str = DESIGN) -> set[str]:
    return {m for m in re.findall(r"`([\w./{},*-]+)`", text) if "/" in m and not m.startswith(("/", "ragpool.io"))}


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^}]+)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in _expand(path[: m.start()] + alt + path[m.end():])]


def test_every_path_the_docs_name_exists() -> None:
    missing = [p for named in _named_paths(DESIGN) | _named_paths(TESTING) for p in _expand(named)
               if "<" not in p and not (REPO / p.rstrip("/")).exists() and not list(REPO.glob(p))]
    assert missing == []


def _component_modules() -> set[str]:
    """infra modules that define a Pulumi component (a class deriving from a component base)."""
    out = set()
    for path in (REPO / "infra").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")) in ("RagpoolComponent", "ComponentResource")
                    for b in node.bases):
                out.add(f"infra/{path.name}")
    return out - {"infra/component.py"}  # the base class itself


def test_every_infra_component_and_training_room_is_listed() -> None:
    named = {p for n in _named_paths() for p in _expand(n)}
    assert _component_modules() - named == set()
    rooms = {f"training/{d.name}/" for d in (REPO / "training").iterdir()
             if d.is_dir() and (d / "__init__.py").exists()}
    assert rooms - named == set()
