from __future__ import annotations

import pytest

from tests.infra.harness import SCHEMAS_DIR


@pytest.fixture(scope="session")
def schemas_dir():
    """The vendored upstream schemas and chart defaults (vendor/upstream/, always in the repo)."""
    return SCHEMAS_DIR


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/infra/" in str(item.fspath):
            item.add_marker(pytest.mark.infra)


@pytest.fixture
def pulumi_mocks():
    """Fresh mocks for one test (state never leaks between tests)."""
    import pulumi

    from infra.plan import _make_mocks

    mocks = _make_mocks("us-west-2")
    pulumi.runtime.set_mocks(mocks, project="ragpool", stack="dev", preview=False)
    yield mocks
