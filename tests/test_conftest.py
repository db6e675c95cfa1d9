"""The suite's own scheduling (tests/conftest.py): what ``make test`` hands to its xdist workers first."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import pytest_xdist_make_scheduler, xdist_scope


class _Node:
    """Stands in for an xdist worker: records the node ids it is sent, in order."""

    def __init__(self, name: str, collection: list[str]) -> None:
        self.name, self.collection, self.sent = name, collection, []
        self.gateway, self.shutting_down = SimpleNamespace(id=name), False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(self.collection[i] for i in indexes)

    def shutdown(self) -> None:
        pass


def _first_units(collection: list[str], workers: int = 2) -> list[list[str]]:
    config = SimpleNamespace(getvalue={"dist": "loadscope", "tx": [f"{workers}*popen"]}.get,
                             option=SimpleNamespace(loadscopereorder=True))  # xdist's default
    sched = pytest_xdist_make_scheduler(config, None)
    nodes = [_Node(f"gw{i}", collection) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return [node.sent for node in nodes]


def test_the_heaviest_scope_starts_first_even_when_a_light_module_has_more_tests() -> None:
    ray = ["tests/training/ray/test_driver.py::test_a", "tests/training/ray/test_from_zero.py::test_b"]
    heavy = ["tests/training/test_fsdp.py::test_c"]
    light = [f"tests/training/test_config.py::test_{i}" for i in range(50)]
    # The order pytest_collection_modifyitems leaves (heaviest first); xdist's default reorders by test count.
    gw0, gw1 = _first_units(ray + heavy + light)
    assert gw0[:2] == ray, gw0[:3]  # the Ray scope, both its modules, on one worker and first
    assert gw1[:1] == heavy, gw1[:3]
    assert sorted(gw0 + gw1) == sorted(ray + heavy + light)


def test_shared_scopes_keep_their_modules_on_one_worker() -> None:
    assert xdist_scope("tests/training/ray/test_placement.py::t") == xdist_scope("tests/training/ray/test_driver.py::t")
    assert xdist_scope("tests/training/reports/test_logs.py::t") == xdist_scope("tests/training/ray/test_driver.py::t")
    assert xdist_scope("tests/training/test_fsdp.py::t") == "tests/training/test_fsdp.py"


def test_no_more_training_units_run_at_once_than_the_limit_while_other_units_wait() -> None:
    from tests.conftest import TRAINING_AT_ONCE, TRAINING_MODULES

    ray = ["tests/training/ray/test_driver.py::test_a"]
    training = [f"{module}::test_t" for module in TRAINING_MODULES[:3]]
    other = [f"tests/infra/test_{name}.py::test_o" for name in ("a", "b", "c", "d", "e", "f")]
    units = _first_units(ray + training + other, workers=3)
    first = [sent[0] for sent in units]  # the unit each worker starts with
    assert first == [ray[0], training[0], other[0]] and TRAINING_AT_ONCE == 2, units
    # Every node keeps a second unit queued: none of them is a third training unit while two are unfinished.
    assert sum(t in training + ray for sent in units for t in sent) == 2, units
