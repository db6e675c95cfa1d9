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


DATA_ON_DEV = {
    "ragpool:dataBuckets": [
        {"bucket": "team-corpora", "kmsKeyArn": "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"},
        {"bucket": "public-corpora"}],
    "ragpool:dataExport": {"bucket": "team-exports", "prefix": "ragpool/exports/"},
    "ragpool:trainingTeams": [{"name": "search", "gpuQuota": 4}],
}
"""dataBuckets (one SSE-KMS bucket) and dataExport on dev, with a team: the data role of two namespaces."""


@pytest.fixture(scope="session")
def data_plan(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict:
    """The dev plan with ``DATA_ON_DEV``, built once per run (``once_per_run``) for the data access tests
    (tests/infra/test_data_access.py) and the reachability matrix. Never mutate it."""
    import json
    from pathlib import Path

    from infra.plan import plan
    from tests.support.once import once_per_run

    def build(out: Path) -> None:
        (out / "plan.json").write_text(json.dumps(plan("dev", overrides=DATA_ON_DEV)))

    return json.loads((once_per_run(tmp_path_factory, worker_id, "data_plan", build) / "plan.json").read_text())
