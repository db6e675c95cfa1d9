"""contract/ is the one home of the environment variables that cross a plane (contract/env.py, and those with a
shape beside their parser: contract/lanes.py, paths.py, ray_auth.py, ...): no other file of the project's code
(tests/support/tree.py) writes one of their names as a string literal (an exact string token; docstrings and
messages that mention a name are prose, and ``$(NAME)`` references are built from the constant)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import importlib
import pkgutil

import contract
from contract import env
from tests.support.tree import REPO, SOURCE_PACKAGES

CONTRACT_MODULES = [importlib.import_module(f"contract.{m.name}") for m in pkgutil.iter_modules(contract.__path__)]
NAMES = {value: f"{module.__name__}.{name}" for module in CONTRACT_MODULES for name, value in vars(module).items()
         if name.endswith("_ENV") and isinstance(value, str)}
HOMES = {Path(module.__file__) for module in CONTRACT_MODULES}


def env_literals(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of each string token in ``path`` that is exactly one of the names."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.string.strip("\"'") in NAMES and tok.string[0] in "\"'":
            found.append((tok.start[0], lines[tok.start[0] - 1].strip()))
    return found


def test_each_name_is_declared_once():
    """Each ``*_ENV = "NAME"`` assignment in contract/ names a variable no other assignment there names (a module
    that needs another's name imports it)."""
    declared = [(tok_next.string.strip("\"'"), path.name) for path in sorted(HOMES)
                for tok, tok_next in _assignments(path)]
    values = [value for value, _ in declared]
    assert len(values) == len(set(values)), sorted(d for d in declared if values.count(d[0]) > 1)
    assert set(values) == set(NAMES)
    assert all(name in NAMES for name in (v for k, v in vars(env).items() if k.endswith("_ENV")))


def _assignments(path: Path):
    """(name token, string token) of each top-level ``SOMETHING_ENV = "..."`` in ``path``."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)]
    for a, b, c in zip(toks, toks[1:], toks[2:]):
        if a.type == tokenize.NAME and a.string.endswith("_ENV") and a.start[1] == 0 and b.string == "=" \
                and c.type == tokenize.STRING:
            yield a, c


def test_no_other_file_writes_a_variable_name_as_a_literal():
    found = [f"{path.relative_to(REPO).as_posix()}:{n}: {line}"
             for package in SOURCE_PACKAGES for path in sorted((REPO / package).rglob("*.py")) if path not in HOMES
             for n, line in env_literals(path)]
    assert not found, "import these from contract/ instead:\n" + "\n".join(found)


def test_the_check_sees_a_literal(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Reads RAGPOOL_WORKER_ID."""\nx = env.get("RAGPOOL_WORKER_ID")\ny = f"$(RAGPOOL_WORKER_GROUP)"\n')
    assert env_literals(sample) == [(2, 'x = env.get("RAGPOOL_WORKER_ID")')]
