"""Fixtures every test directory may use; helpers live in ``tests/support`` (imported as ``tests.support``)."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.redis_fixtures", "tests.support.ci_skips"]

REDIS_FIXTURES = frozenset({"redis_server", "make_queue", "own_redis", "sentinel_group"})
"""Fixtures of tests/support/redis_fixtures.py that start a real redis-server: a test using one is marked ``redis``."""

STACKS = ("dev", "prod")
"""The committed stacks (Pulumi.<stack>.yaml)."""


@pytest.fixture(scope="session")
def committed_plans(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, dict]:
    """Offline plans of the committed stacks (the real program under fresh mocks), built once per run for
    every test that reads them (``once_per_run``: under xdist the first worker builds them, the others read its
    JSON), so the program runs twice per run, not twice per worker. Never mutate them: use ``plan_of``."""
    import json

    from infra.plan import plan
    from tests.support.once import once_per_run

    def build(out: Path) -> None:
        (out / "plans.json").write_text(json.dumps({stack: plan(stack) for stack in STACKS}))

    # Plain JSON values: what plan() returns.
    return json.loads((once_per_run(tmp_path_factory, worker_id, "committed_plans", build) / "plans.json").read_text())


TEAMS_ON_PROD = ({"name": "search", "gpuQuota": 4}, {"name": "answers", "gpuQuota": 16})
"""The training teams of ``team_plan``: two team namespaces beside the main one, so three RayClusters."""


@pytest.fixture(scope="session")
def team_plan(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict:
    """The prod plan with ``TEAMS_ON_PROD``, built once per run (``once_per_run``) for the tests of the Ray clusters
    (tests/infra/test_ray_cluster.py) and of their token-auth policy (tests/policy/test_ray_token_auth.py). Never
    mutate it."""
    import json

    from infra.plan import plan
    from tests.support.once import once_per_run

    def build(out: Path) -> None:
        (out / "plan.json").write_text(json.dumps(plan("prod", overrides={"ragpool:trainingTeams": list(TEAMS_ON_PROD)})))

    return json.loads((once_per_run(tmp_path_factory, worker_id, "team_plan", build) / "plan.json").read_text())


@pytest.fixture
def plan_of(committed_plans) -> Callable[[str], dict]:
    """A private deep copy of a committed plan, for tests that mutate it."""
    return lambda stack: copy.deepcopy(committed_plans[stack])


TEST_PROCESS_GC_THRESHOLDS = (10_000, 10, 100)
"""``gc.set_threshold`` of every pytest process (the xdist workers included). Their heaps are large and long-lived
(torch, transformers, Ray, pulumi_aws, moto, the plans) and keep growing with what tests import, so Python's
defaults (700, 10, 10) walk all of it in a full collection every few seconds: measured, the in-process
``tests/infra`` tests spent 18-19 of their 67 CPU-seconds there. With these thresholds the same tests take
48 CPU-seconds (no full collection) and peak at 801 MB instead of 645 MB."""


def pytest_configure(config: pytest.Config) -> None:
    gc.set_threshold(*TEST_PROCESS_GC_THRESHOLDS)


@pytest.fixture(autouse=True)
def _collector_as_python_leaves_it():
    """A test that runs a stage's setup in this process (``Trainer``: ``heap.settle``) leaves no frozen objects
    and no paused collector behind it."""
    yield
    gc.unfreeze()
    gc.enable()


HEAVY_FIRST = ("ray", "torch_multiproc", "e2e", "slow")
"""Under xdist, modules whose tests carry one of these markers are handed out first (in this order), so the
longest ones start at once instead of forming the suite's tail."""

RAY_MODULES = ("tests/training/ray/test_driver.py", "tests/training/ray/test_from_zero.py",
               "tests/training/ray/test_placement.py", "tests/training/ray/test_queue_ray.py",
               "tests/training/ray/test_faulthandler.py", "tests/training/ray/test_elastic.py")
"""The modules that start a local Ray (marker ``ray``; a ``ray`` module missing here is refused at collection).
Under xdist at most one of them runs at a time: each cluster is its own (explicit addresses, own temp dirs, free
ports), so they could run side by side, but on 2 cores two Ray clusters with training workers only slow each other
(measured: 15 min 48 s for the suite against 14 min 31 s one after another)."""

RAY_DRIVER_MODULES = ("tests/training/ray/test_driver.py", "tests/training/ray/test_from_zero.py",
                      "tests/training/ray/test_placement.py")
"""Of ``RAY_MODULES``, those whose tests make the xdist worker process itself a Ray driver (``ray.init`` to their
cluster, ``ray.shutdown`` after): each runs in a worker process that was never a driver before, while one is
left. A worker that had been the driver of one cluster and then connected to the next crashed (1 run in 6):
SIGSEGV in Ray's C++ logging (``spdlog::logger::sink_it_`` reading freed heap, from the kernel's report and the
symbols of Ray 2.58's ``_raylet.so``), a thread logging through what the earlier session left behind."""

TRAINING_MODULES = (
    "tests/bench/test_recovery.py", "tests/training/components/test_dcp.py",
    "tests/training/components/test_distributed.py", "tests/training/reports/test_logs.py",
    "tests/training/reports/test_report.py", "tests/training/test_ddp.py", "tests/training/test_entrypoints.py",
    "tests/training/test_fsdp.py", "tests/training/test_generator.py", "tests/training/test_index.py",
    "tests/training/test_pipeline.py",
    "tests/training/test_resume.py",
    "tests/training/elastic/test_launch.py",
)
"""The modules besides ``RAY_MODULES`` whose tests run training processes (marker ``torch_multiproc``; a module
with the marker missing here is refused at collection)."""

TRAINING_AT_ONCE = 2
"""Under xdist, how many of the training units (``TRAINING_MODULES`` and ``RAY_MODULES``) run at once; the other
workers take the rest meanwhile (servers, waits, plans), so tests that mostly wait overlap training instead of
forming the suite's tail. On 2 cores three training units side by side oversubscribe the cores (each is 2-3
CPU-bound processes). Measured on a noisy 2-core machine: 14 min 12 s without the limit, 13 min 55 s with it."""


def xdist_scope(nodeid: str) -> str:
    """The unit xdist hands to one worker: the test's module (its classes included)."""
    return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` (what ``make test`` runs) with :func:`xdist_scope` as the scope: each module is one
    unit, so a module's expensive ``scope="module"`` fixture (a Ray cluster) is built once, in one worker. Units
    go out in collection order (heaviest first), except what ``RAY_MODULES``, ``RAY_DRIVER_MODULES`` and
    ``TRAINING_AT_ONCE`` hold back. (xdist's own ``loadgroup`` cannot be used: with pytest 9.2 its
    ``xdist_group`` marker no longer reaches the node ids it schedules by.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist reorders scopes by test count unless told not to (--no-loadscope-reorder): that order would put the
    # modules with the most (and cheapest) tests first and start the Ray modules, the longest, minutes late.
    config.option.loadscopereorder = False

    ray, drivers, training = set(RAY_MODULES), set(RAY_DRIVER_MODULES), {*TRAINING_MODULES, *RAY_MODULES}
    if not drivers <= ray:
        raise pytest.UsageError(f"RAY_DRIVER_MODULES not in RAY_MODULES (tests/conftest.py): {sorted(drivers - ray)}")

    class ModuleScopes(LoadScopeScheduling):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.drivers_of: dict[object, list[str]] = {}
            """Worker -> the ``RAY_DRIVER_MODULES`` it was given."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _next_unit(self, node) -> str | None:
            """The first unit in order that keeps every rule; else the first that only breaks the limits on
            running at once (better than an idle worker); else None: only Ray driver units are left and
            another live worker was never a driver, so this one stays idle and the others take them."""
            running = {scope for work in self.assigned_work.values() for scope, tests in work.items()
                       if not all(tests.values())}
            fresh = any(not n.shutting_down and not self.drivers_of.get(n) for n in self.assigned_work if n is not node)

            def allowed(scope: str, limits: bool) -> bool:
                if scope in drivers and self.drivers_of.get(node) and fresh:
                    return False
                if limits and scope in ray and running & ray:
                    return False
                return not (limits and scope in training and len(running & training) >= TRAINING_AT_ONCE)

            return (next((s for s in self.workqueue if allowed(s, limits=True)), None)
                    or next((s for s in self.workqueue if allowed(s, limits=False)), None))

        def _assign_work_unit(self, node) -> None:
            scope = self._next_unit(node)
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            if scope in drivers:
                self.drivers_of.setdefault(node, []).append(scope)
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
        if item.get_closest_marker("ray") is not None and module not in RAY_MODULES:
            raise pytest.UsageError(f"{module} starts Ray (marker ray) but is not in RAY_MODULES "
                                    "(tests/conftest.py): add it")
        if (item.get_closest_marker("torch_multiproc") is not None and module not in RAY_MODULES
                and module not in TRAINING_MODULES):
            raise pytest.UsageError(f"{module} runs training processes (marker torch_multiproc) but is not in "
                                    "TRAINING_MODULES (tests/conftest.py): add it")
        weight = next((i for i, m in enumerate(HEAVY_FIRST) if item.get_closest_marker(m)), len(HEAVY_FIRST))
        rank[module] = min(rank.get(module, weight), weight)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
