"""contract/env.py is the one home of the environment variables that cross a plane: no other file of the
project's code (tests/support/tree.py) writes one of their names as a string literal (an exact string token;
docstrings and messages that mention a name are prose, and ``$(NAME)`` references are built from the constant)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from contract import env
from tests.support.tree import REPO, SOURCE_PACKAGES

NAMES = {value: name for name, value in vars(env).items() if name.endswith("_ENV")}


def env_literals(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of each string token in ``path`` that is exactly one of the names."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.string.strip("\"'") in NAMES and tok.string[0] in "\"'":
            found.append((tok.start[0], lines[tok.start[0] - 1].strip()))
    return found


def test_the_names_are_distinct():
    assert len(NAMES) == len([n for n in vars(env) if n.endswith("_ENV")])


def test_no_other_file_writes_a_variable_name_as_a_literal():
    home = REPO / "contract" / "env.py"
    found = [f"{path.relative_to(REPO).as_posix()}:{n}: {line}"
             for package in SOURCE_PACKAGES for path in sorted((REPO / package).rglob("*.py")) if path != home
             for n, line in env_literals(path)]
    assert not found, "import these from contract.env instead:\n" + "\n".join(found)


def test_the_check_sees_a_literal(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Reads RAGPOOL_WORKER_ID."""\nx = env.get("RAGPOOL_WORKER_ID")\ny = f"$(RAGPOOL_WORKER_GROUP)"\n')
    assert env_literals(sample) == [(2, 'x = env.get("RAGPOOL_WORKER_ID")')]
