"""contract/ports.py is the one home of the ports ragpool's own processes listen on.

Every other Python file of the project names them through it: a number token equal to one of
these ports anywhere else in the project's code (tests/support/tree.py) is a second home
(docstrings and comments, which are not number tokens, may still show them in example commands).
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from tests.support.tree import SOURCE_PACKAGES as PACKAGES
from contract import ports

REPO = Path(__file__).resolve().parents[2]
PORTS = {name: value for name, value in vars(ports).items() if name.endswith("_PORT")}
#: The same number meaning another fact: Ray's GCS listens on 6379 by default (`ray start --port`).
OTHER_FACTS = {("infra/training_namespace.py", "RAY_GCS_PORT = 6379")}


def port_literals(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of each number token in ``path`` equal to one of ragpool's ports."""
    text = path.read_text()
    lines = text.splitlines()
    values = {str(v) for v in PORTS.values()}
    return [(tok.start[0], lines[tok.start[0] - 1].strip())
            for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.NUMBER and tok.string in values]


def test_the_ports_are_distinct_and_valid():
    assert set(PORTS) >= {"REDIS_PORT", "QUEUE_METRICS_PORT", "RANK_METRICS_PORT", "RDZV_PORT"}
    assert len(set(PORTS.values())) == len(PORTS), PORTS
    assert all(0 < v < 65536 for v in PORTS.values()), PORTS


def test_no_other_file_writes_a_port_as_a_literal():
    home = REPO / "contract" / "ports.py"
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path == home:
                continue
            rel = path.relative_to(REPO).as_posix()
            found += [f"{rel}:{n}: {line}" for n, line in port_literals(path)
                      if not any(rel == f and line.startswith(prefix) for f, prefix in OTHER_FACTS)]
    assert not found, "import these from contract.ports instead:\n" + "\n".join(found)


def test_the_check_sees_a_literal(tmp_path):
    """The scan finds a port written as a number (and not one in a docstring or comment)."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Listens on 9300."""\nPORT = 9300  # 9400\n')
    assert port_literals(sample) == [(2, "PORT = 9300  # 9400")]


def test_free_ports_are_distinct_and_free_on_loopback():
    """The local servers' ports (training.localdev): distinct, and each one can be bound right away."""
    import socket

    picked = ports.free_ports(6)
    assert len(set(picked)) == 6, picked
    for port in [*picked, ports.free_port()]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
