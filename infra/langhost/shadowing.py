"""Program-directory modules that would shadow an installed module under the language host.

Pulumi's Python language host runs ``runpy.run_path(".")`` in the program directory
(infra/langhost/mock_exec.py says where this is upstream), which puts that directory first on
``sys.path`` while the program runs: ``infra/redis.py`` became the top-level module ``redis`` and
redis-py's ``from redis.backoff import ...`` failed. ``program_shadowing`` lists every module or
package of the program directory whose top-level name is also the standard library's, an
installed distribution's, one found on ``sys.path``, or one of this project's packages.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import pkgutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Never imported by name: the host runs __main__ itself, and __init__ is no module name.
_NOT_MODULE_NAMES = {"__main__", "__init__"}


def program_module_names(program_dir: Path) -> dict[str, str]:
    """Top-level module name -> file or folder, for each module and package directly in ``program_dir``."""
    suffixes = importlib.machinery.all_suffixes()
    names: dict[str, str] = {}
    for path in sorted(program_dir.iterdir()):
        if path.is_file() and any(path.name.endswith(s) for s in suffixes):
            name = path.name.split(".", 1)[0]  # extension modules: name.cpython-312-x86_64-linux-gnu.so
        elif path.is_dir() and ((path / "__init__.py").is_file() or any(path.glob("*.py"))):
            name = path.name  # a package, or a namespace portion that merges into one of that name
        else:
            continue
        if name.isidentifier() and name not in _NOT_MODULE_NAMES:
            names.setdefault(name, path.name)
    return names


def installed_top_level_names(program_dir: Path) -> dict[str, str]:
    """Top-level module name -> what provides it, for everything importable except ``program_dir`` itself."""
    owners: dict[str, str] = {}
    for name in sys.stdlib_module_names | set(sys.builtin_module_names):
        owners[name] = "a standard-library module"
    for name, dists in importlib.metadata.packages_distributions().items():
        owners.setdefault(name, f"a module of the installed distribution {', '.join(sorted(set(dists)))}")
    for dist in importlib.metadata.distributions():
        dist_name = (dist.metadata["Name"] or "").lower().replace("-", "_").replace(".", "_")
        if dist_name:
            owners.setdefault(dist_name, f"the name of the installed distribution {dist.metadata['Name']}")
    for path in sorted(REPO_ROOT.iterdir()):
        if (path / "__init__.py").is_file():
            owners.setdefault(path.name, f"this project's package {path.name}/")
    program = program_dir.resolve()
    for entry in sys.path:
        where = Path(entry or ".").resolve()
        if where == program or not where.is_dir():
            continue
        for module in pkgutil.iter_modules([str(where)]):
            owners.setdefault(module.name, f"a module found on sys.path in {where}")
    return owners


def program_shadowing(program_dir: Path) -> list[str]:
    """One line per program-directory module that shadows an installed one; empty when none does."""
    owners = installed_top_level_names(program_dir)
    return [f"{program_dir.name}/{entry}: `{name}` is also {owners[name]}; the language host puts "
            f"{program_dir.name}/ first on sys.path, so this one replaces it for every import: rename it"
            for name, entry in program_module_names(program_dir).items() if name in owners]
