"""dashboards/ sits below infra/: infra/monitoring.py and infra/ray_cluster.py import the dashboards
and rules they ship, so no dashboards module imports infra (an import cycle; what both need, such as
the Ray version or the pool label, lives in training/, which both import)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_packages(source: str) -> set[str]:
    """Top-level packages ``source`` imports (absolute imports, lazy ones inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_no_dashboards_module_imports_infra():
    offenders = [path.relative_to(REPO).as_posix() for path in sorted((REPO / "dashboards").rglob("*.py"))
                 if "infra" in imported_packages(path.read_text())]
    assert not offenders, f"dashboards/ modules importing infra/ (a cycle: infra imports dashboards): {offenders}"


def test_infra_does_import_dashboards():
    """The direction this test protects is real (else it guards nothing)."""
    assert "dashboards" in imported_packages((REPO / "infra" / "monitoring.py").read_text())


def test_the_scan_sees_a_lazy_import():
    assert imported_packages("def f():\n    from infra.charts import X\n") == {"infra"}
