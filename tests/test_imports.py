"""Which plane may import which: the boundaries the contract refactor (issue 43) drew, checked on every file.

- contract/ is the contract between the planes: it imports nothing but the standard library and itself, so
  every plane can read it without pulling in another (nor torch: tests/training/test_torch_boundary.py).
- infra/, dashboards/ and policy/ import nothing of training/: what they share with it is in contract/.
- dashboards/ sits below infra/: infra/monitoring.py and infra/ray_cluster.py import the dashboards and rules
  they ship, so no dashboards module imports infra (an import cycle).

- No module imports itself back through others: zero import circles in the repo (a module-level graph; a package's
  ``__init__`` is not an edge of its submodules).

Imports inside functions count: a lazy import is an import all the same.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, modules: set[str]) -> set[str]:
    """The project modules ``source`` imports: for each import, the longest name in ``modules`` it starts with
    (``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in modules), "")} - {""}
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_import_circles_in_the_repo():
    paths = {module_name(p): p for package in SOURCE_PACKAGES for p in sorted((REPO / package).rglob("*.py"))}
    modules = set(paths)
    graph = {m: imported_modules(p.read_text(), modules) - {m} for m, p in paths.items()}
    assert import_circles(graph) == []


def test_the_circle_check_finds_a_lazy_circle():
    modules = {"a", "a.b", "a.c", "d"}
    assert imported_modules("def f():\n    from a.b import x\nimport d\n", modules) == {"a.b", "d"}
    assert imported_modules("from a import c\n", modules) == {"a.c"}
    assert import_circles({"a.b": {"a.c"}, "a.c": {"d"}, "d": {"a.b"}, "a": set()}) == [["a.b", "a.c", "d"]]
    assert import_circles({"a.b": {"a.c"}, "a.c": set()}) == []


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
    assert "contract" in imported_packages((REPO / "training" / "scheduler" / "worker" / "loop.py").read_text())
    assert {"contract", "infra", "dashboards", "policy", "training"} <= set(SOURCE_PACKAGES)


def test_the_scan_sees_a_lazy_import():
    assert imported_packages("def f():\n    from infra.charts import X\n") == {"infra"}
    assert imported_packages("import training.scheduler.lanes as l\n") == {"training"}
