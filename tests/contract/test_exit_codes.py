"""contract/exit_codes.py is the one home of the process exit codes: no command writes one as a number.

Every ``return N`` (N a non-zero code of exit_codes), ``sys.exit(N)``, ``SystemExit(N)`` and
``parser.exit(N)`` with a literal non-zero N in the project's code (tests/support/tree.py) is a second
home of that code. ``return 1`` stays allowed (plenty of functions return the number one);
``return exit_codes.FAILED`` is how a command says it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.tree import SOURCE_PACKAGES as PACKAGES
from contract import exit_codes

REPO = Path(__file__).resolve().parents[2]
CODES = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int) and v > 1}
#: Runs as a bare script (``python infra/langhost/mock_exec.py``, sys.path[0] = its folder) and
#: imports only the standard library and pulumi by design, so it cannot import training.
STANDALONE = {"infra/langhost/mock_exec.py"}
#: Being written by another change as this check landed; drop an entry once its change uses exit_codes.
NOT_YET: tuple[str, ...] = ()
EXITS = {"exit", "SystemExit", "_exit"}


def literal_codes(source: str) -> list[tuple[int, str]]:
    """(line, snippet) of each exit code written as a number in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value in CODES \
                and type(node.value.value) is int:
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            value = node.args[0].value
            if name in EXITS and type(value) is int and value != 0:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_command_writes_an_exit_code_as_a_number():
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in STANDALONE or rel.startswith(NOT_YET):
                continue
            found += [f"{rel}:{n}: {snippet}" for n, snippet in literal_codes(path.read_text())]
    assert not found, "use contract.exit_codes instead:\n" + "\n".join(found)


def test_the_check_sees_a_literal_code():
    source = "import sys\ndef main():\n    if x:\n        return 2\n    sys.exit(4)\n    return 1\n"
    assert literal_codes(source) == [(4, "return 2"), (5, "sys.exit(4)")]


def test_the_codes_are_distinct_where_they_should_be():
    """Only REFUSED shares a number (FAILED's): a command that refuses, fails."""
    named = {k: v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    by_value: dict[int, set[str]] = {}
    for k, v in named.items():
        by_value.setdefault(v, set()).add(k)
    assert [names for names in by_value.values() if len(names) > 1] == [{"FAILED", "REFUSED"}]
