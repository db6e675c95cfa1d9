"""Fixtures every test directory may use; helpers live in ``tests/support`` (imported as ``tests.support``)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

pytest_plugins = ["tests.support.redis_fixtures", "tests.support.ci_skips"]

REDIS_FIXTURES = frozenset({"redis_server", "make_queue", "own_redis", "sentinel_group"})
"""Fixtures of tests/support/redis_fixtures.py that start a real redis-server: a test using one is marked ``redis``."""

STACKS = ("dev", "prod")
"""The committed stacks (Pulumi.<stack>.yaml)."""


@pytest.fixture(scope="session")
def committed_plans(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, dict]:
    """Offline plans of the committed stacks (the real program under fresh mocks), built once per run for
    every test that reads them: under xdist the first worker to need them builds them (under a file lock)
    and the others read its JSON, so the program runs twice per run, not twice per worker. Never mutate
    them: use ``plan_of``."""
    import json

    from filelock import FileLock

    from infra.plan import plan

    if worker_id == "master":  # not under xdist
        return {stack: plan(stack) for stack in STACKS}
    cached = tmp_path_factory.getbasetemp().parent / "committed_plans.json"  # the run's directory, shared
    with FileLock(f"{cached}.lock"):
        if not cached.is_file():
            cached.write_text(json.dumps({stack: plan(stack) for stack in STACKS}))
        return json.loads(cached.read_text())  # equal to what plan() returns (plain JSON values)


@pytest.fixture
def plan_of(committed_plans) -> Callable[[str], dict]:
    """A private deep copy of a committed plan, for tests that mutate it."""
    return lambda stack: copy.deepcopy(committed_plans[stack])


HEAVY_FIRST = ("ray", "torch_multiproc", "e2e", "slow")
"""Under xdist, modules whose tests carry one of these markers are handed out first (in this order), so the
longest ones start at once instead of forming the suite's tail."""

SHARED_SCOPES = {
    "ray": ("tests/training/ray/test_driver.py", "tests/training/ray/test_from_zero.py",
            "tests/training/ray/test_placement.py", "tests/training/ray/test_queue_ray.py",
            "tests/training/reports/test_logs.py", "tests/training/reports/test_report.py"),
}
"""Test modules that share one xdist worker, run one after another: the modules starting a local Ray (each
cluster is its own: ``ray.init(address="local")``, explicit addresses, own temp dirs and free ports, so they
could run side by side, but on 2 cores two Ray clusters with training workers only slow each other: measured
15 min 48 s for the suite against 14 min 31 s one after another), with the reports modules, which read the same
session-scoped finished run as two of them (``finished_run``, tests/training/conftest.py: made once per run).
A ``ray`` test outside ``SHARED_SCOPES["ray"]`` is refused at collection."""

TRAINING_MODULES = (
    "tests/bench/test_recovery.py", "tests/training/components/test_dcp.py",
    "tests/training/components/test_distributed.py", "tests/training/test_ddp.py", "tests/training/test_entrypoints.py",
    "tests/training/test_fsdp.py", "tests/training/test_generator.py", "tests/training/test_pipeline.py",
    "tests/training/test_resume.py",
)
"""The modules outside the ``ray`` scope whose tests run training processes (marker ``torch_multiproc``; a module
with the marker missing here is refused at collection)."""

TRAINING_AT_ONCE = 2
"""Under xdist, how many of the training units (these modules and the ``ray`` scope) run at once; the other
workers take the rest meanwhile (servers, waits, plans), so tests that mostly wait overlap training instead of
forming the suite's tail. On 2 cores three training units side by side oversubscribe the cores (each is 2-3
CPU-bound processes). Measured on a noisy 2-core machine: 14 min 12 s without the limit, 13 min 55 s with it."""

_SCOPE_OF = {module: scope for scope, modules in SHARED_SCOPES.items() for module in modules}


def xdist_scope(nodeid: str) -> str:
    """The unit xdist hands to one worker: the test's module, or the shared scope that module belongs to."""
    module = nodeid.split("::", 1)[0]
    return _SCOPE_OF.get(module, module)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` (what ``make test`` runs) with :func:`xdist_scope` as the scope: each module is one
    unit, so a module's expensive ``scope="module"`` fixture (a finished run, a Ray cluster) is built once, in one
    worker, and ``SHARED_SCOPES`` keep their modules together. (xdist's own ``loadgroup`` cannot be used: with
    pytest 9.2 its ``xdist_group`` marker no longer reaches the node ids it schedules by.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist reorders scopes by test count unless told not to (--no-loadscope-reorder): that order would put the
    # modules with the most (and cheapest) tests first and start the Ray scope, the longest, minutes late.
    config.option.loadscopereorder = False

    training = {*TRAINING_MODULES, "ray"}

    class ModuleScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            """The next unit in order, except a training unit while ``TRAINING_AT_ONCE`` run (or wait on a worker):
            then the first other unit, if any is left."""
            running = {scope for work in self.assigned_work.values() for scope, tests in work.items()
                       if not all(tests.values())}
            if len(running & training) >= TRAINING_AT_ONCE:
                other = next((scope for scope in self.workqueue if scope not in training), None)
                if other is not None:
                    self.workqueue.move_to_end(other, last=False)
            super()._assign_work_unit(node)

    return ModuleScopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers that say what a test needs (``redis`` from the fixtures it uses), and modules ordered heaviest
    first (``HEAVY_FIRST``; each module's tests stay together and in order): the order xdist hands them out."""
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)
        if item.get_closest_marker("ray") is not None and xdist_scope(item.nodeid) != "ray":
            raise pytest.UsageError(f"{module} starts Ray (marker ray) but is not in SHARED_SCOPES['ray'] "
                                    "(tests/conftest.py): add it")
        if (item.get_closest_marker("torch_multiproc") is not None and xdist_scope(item.nodeid) != "ray"
                and module not in TRAINING_MODULES):
            raise pytest.UsageError(f"{module} runs training processes (marker torch_multiproc) but is not in "
                                    "TRAINING_MODULES (tests/conftest.py): add it")
        weight = next((i for i, m in enumerate(HEAVY_FIRST) if item.get_closest_marker(m)), len(HEAVY_FIRST))
        rank[module] = min(rank.get(module, weight), weight)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
