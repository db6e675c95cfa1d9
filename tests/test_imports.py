"""Which plane may import which: the boundaries the contract refactor (issue 43) drew, checked on every file.

- contract/ is the contract between the planes: it imports nothing but the standard library and itself, so
  every plane can read it without pulling in another (nor torch: tests/training/test_torch_boundary.py).
- infra/, dashboards/ and policy/ import nothing of training/: what they share with it is in contract/.
- dashboards/ sits below infra/: infra/monitoring.py and infra/ray_cluster.py import the dashboards and rules
  they ship, so no dashboards module imports infra (an import cycle).

Imports inside functions count: a lazy import is an import all the same.
"""

from __future__ import annotations

import ast
import sys

from tests.support.tree import REPO, SOURCE_PACKAGES


def imported_packages(source: str) -> set[str]:
    """Top-level packages ``source`` imports (absolute imports, lazy ones inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def importers(package: str, forbidden: set[str]) -> list[str]:
    """``file: packages`` for each file of ``package`` that imports one of ``forbidden``."""
    return [f"{path.relative_to(REPO).as_posix()}: {sorted(hit)}"
            for path in sorted((REPO / package).rglob("*.py"))
            if (hit := imported_packages(path.read_text()) & forbidden)]


def test_contract_imports_only_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"contract", "__future__"}
    offenders = [f"{path.relative_to(REPO).as_posix()}: {sorted(hit)}"
                 for path in sorted((REPO / "contract").rglob("*.py"))
                 if (hit := imported_packages(path.read_text()) - allowed)]
    assert not offenders, f"contract/ must stay dependency-free and plane-free: {offenders}"


def test_infra_dashboards_and_policy_import_the_contract_not_training():
    offenders = [line for package in ("infra", "dashboards", "policy") for line in importers(package, {"training"})]
    assert not offenders, f"import what you share with training/ from contract/ instead: {offenders}"


def test_no_dashboards_module_imports_infra():
    offenders = importers("dashboards", {"infra"})
    assert not offenders, f"dashboards/ modules importing infra/ (a cycle: infra imports dashboards): {offenders}"


def test_the_boundaries_are_real():
    """The directions these tests protect are real (else they guard nothing): infra imports dashboards and the
    contract, training imports the contract, and the scan covers every source package."""
    assert "dashboards" in imported_packages((REPO / "infra" / "monitoring.py").read_text())
    assert "contract" in imported_packages((REPO / "infra" / "worker_jobs.py").read_text())
    assert "contract" in imported_packages((REPO / "training" / "scheduler" / "supervisor.py").read_text())
    assert {"contract", "infra", "dashboards", "policy", "training"} <= set(SOURCE_PACKAGES)


def test_the_scan_sees_a_lazy_import():
    assert imported_packages("def f():\n    from infra.charts import X\n") == {"infra"}
    assert imported_packages("import training.scheduler.lanes as l\n") == {"training"}
