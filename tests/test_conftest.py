"""The suite's own scheduling (tests/conftest.py): what ``make test`` hands to its xdist workers, and when."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import (RAY_DRIVER_MODULES, RAY_MODULES, TRAINING_AT_ONCE, TRAINING_MODULES,
                            pytest_xdist_make_scheduler)


class _Node:
    """Stands in for an xdist worker: records the node ids it is sent, in order, and which are still pending."""

    def __init__(self, name: str, collection: list[str]) -> None:
        self.name, self.collection, self.sent, self.pending = name, collection, [], []
        self.gateway, self.shutting_down = SimpleNamespace(id=name), False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(self.collection[i] for i in indexes)
        self.pending.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduled(collection: list[str], workers: int):
    config = SimpleNamespace(getvalue={"dist": "loadscope", "tx": [f"{workers}*popen"]}.get,
                             option=SimpleNamespace(loadscopereorder=True))  # xdist's default
    sched = pytest_xdist_make_scheduler(config, None)
    nodes = [_Node(f"gw{i}", collection) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched, nodes


def _run(collection: list[str], workers: int, check=None) -> list[_Node]:
    """The whole run, the workers completing one test each in turn; ``check(nodes)`` after every completion."""
    sched, nodes = _scheduled(collection, workers)
    for _ in range(10 * len(collection)):
        if sched.tests_finished:
            break
        busy = [node for node in nodes if node.pending]
        assert busy, "no worker has a test while tests are left: the run would hang"
        for node in busy:
            sched.mark_test_complete(node, node.pending.pop(0))
            if check:
                check(nodes)
    assert sched.tests_finished
    assert sorted(t for node in nodes for t in node.sent) == sorted(collection)
    return nodes


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _tests(modules, n: int = 3) -> list[str]:
    return [f"{module}::test_{i}" for module in modules for i in range(n)]


def test_the_heaviest_unit_starts_first_even_when_a_light_module_has_more_tests() -> None:
    ray = _tests(RAY_MODULES[:1], 2)
    heavy = _tests(TRAINING_MODULES[:1], 1)
    light = [f"tests/training/test_config.py::test_{i}" for i in range(50)]
    # The order pytest_collection_modifyitems leaves (heaviest first); xdist's default reorders by test count.
    _, (gw0, gw1) = _scheduled(ray + heavy + light, workers=2)
    assert gw0.sent[:2] == ray, gw0.sent[:3]
    assert gw1.sent[:1] == heavy, gw1.sent[:3]


def test_each_ray_driver_module_runs_in_a_worker_that_was_never_a_ray_driver() -> None:
    other = _tests([f"tests/infra/test_{name}.py" for name in "abcdefgh"])
    nodes = _run(_tests(RAY_MODULES) + _tests(TRAINING_MODULES[:3]) + other, workers=3)
    drivers = [sorted({_module(t) for t in node.sent} & set(RAY_DRIVER_MODULES)) for node in nodes]
    assert sorted(len(d) for d in drivers) == [1, 1, 1], drivers


def test_ray_modules_run_one_at_a_time_and_training_units_at_most_two_at_once() -> None:
    other = _tests([f"tests/infra/test_{i}.py" for i in range(40)])
    seen = {"ray": 0, "training": 0}

    def check(nodes) -> None:
        running = {_module(node.collection[i]) for node in nodes for i in node.pending}
        seen["ray"] = max(seen["ray"], len(running & set(RAY_MODULES)))
        seen["training"] = max(seen["training"], len(running & {*RAY_MODULES, *TRAINING_MODULES}))

    _run(_tests(RAY_MODULES) + _tests(TRAINING_MODULES[:4]) + other, workers=3, check=check)
    assert seen == {"ray": 1, "training": TRAINING_AT_ONCE}, seen


def test_with_fewer_workers_than_ray_driver_modules_the_run_still_completes() -> None:
    nodes = _run(_tests(RAY_MODULES) + _tests(["tests/infra/test_a.py"]), workers=2)
    assert {_module(t) for node in nodes for t in node.sent} >= set(RAY_DRIVER_MODULES)
