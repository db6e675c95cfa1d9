"""The KubeRay operator part of infra/ray_cluster.py: CRDs applied from the files vendored in
infra/crds/kuberay/ (nothing fetched at deploy time) and the operator's Helm values as Helm merges
them with the chart's defaults (issue 21, item 6)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from infra.charts import KUBERAY_COMMIT, KUBERAY_CRD_BLOBS, KUBERAY_CRD_DIR, KUBERAY_CRD_FILES, KUBERAY_OPERATOR
from infra.plan import INFRA_DIR
from tests.infra.harness import chart_defaults

CRD_DIR = INFRA_DIR / KUBERAY_CRD_DIR


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def helm_coalesce(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A chart's defaults under user values, as Helm 3 coalesces them for one chart (no subcharts):
    helm/helm pkg/chartutil/coalesce.go (commit 1c73ea44ad243b51d5cb4f838de6bdf51ce817bc)
    coalesceValues and coalesceTablesFullKey: maps merge, scalars and lists replace, and a user
    `null` deletes the chart's key."""

    def tables(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for key, val in src.items():
            if key in dst and dst[key] is None:
                del dst[key]
            elif key not in dst:
                dst[key] = copy.deepcopy(val)
            elif isinstance(val, dict) and isinstance(dst[key], dict):
                tables(dst[key], val)

    merged = copy.deepcopy(values)
    tables(merged, defaults)
    return merged


# ------------------------------------------------------------------ CRDs


def test_crds_are_applied_from_the_vendored_files(committed_plans):
    for stack, doc in committed_plans.items():
        files = {r["name"]: r["inputs"]["file"] for r in doc["resources"]
                 if r["type"] == "kubernetes:yaml/v2:ConfigFile" and r["name"].startswith("ray-crd-")}
        assert sorted(files.values()) == [f"{KUBERAY_CRD_DIR}/{f}" for f in KUBERAY_CRD_FILES], stack
        for path in files.values():
            # Relative to infra/, the working directory of the program and of the provider that reads
            # the file under `main: infra/` (infra/reference/pulumi_language_host.yaml).
            assert "://" not in path and (INFRA_DIR / path).is_file(), (stack, path)


def test_nothing_is_fetched_from_github_at_deploy_time(committed_plans):
    for stack, doc in committed_plans.items():
        fetched = [r["name"] for r in doc["resources"] if "raw.githubusercontent.com" in str(r["inputs"])]
        assert fetched == [], f"{stack}: resources whose inputs name raw.githubusercontent.com: {fetched}"


def test_vendored_crds_are_the_pinned_upstream_files():
    assert sorted(p.name for p in CRD_DIR.glob("*.yaml")) == sorted(KUBERAY_CRD_BLOBS)
    for name, blob in KUBERAY_CRD_BLOBS.items():
        assert git_blob_sha((CRD_DIR / name).read_bytes()) == blob, f"{name} differs from kuberay@{KUBERAY_COMMIT}"
    readme = (CRD_DIR / "README.md").read_text()
    assert KUBERAY_COMMIT in readme and f"`v{KUBERAY_OPERATOR.version}`" in readme


def test_vendored_crds_are_the_ones_the_harness_validates_against():
    # The strict JSON schemas in vendor/upstream/crds/ray.io/ are made from these very files
    # (tests/scripts/test_vendor_schemas.py checks the JSON is what the script makes of them).
    from scripts.vendor_schemas import CRD_SCHEMAS, REPO_ROOT

    sources = [REPO_ROOT / path for path, folder in CRD_SCHEMAS if folder == "crds/ray.io"]
    assert sorted(p.name for p in sources) == ["ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"]
    assert all(p.parent == CRD_DIR.resolve() for p in sources), sources


# ------------------------------------------------------------------ operator values


@pytest.fixture(scope="module")
def operator_values_sent() -> dict[str, Any]:
    """The kuberay-operator release's `values` as the program sends them to the engine (the wire
    form keeps nulls; the plan, like Pulumi's own deserializer, drops them)."""
    import infra.plan as plan_module
    from google.protobuf import json_format

    sent: list[dict[str, Any]] = []

    def monitor(mocks, recorded):
        mon = plan_module.make_monitor(mocks, recorded)
        register = mon.RegisterResource

        def register_resource(request):
            if request.type == "kubernetes:helm.sh/v3:Release" and request.name == "ray-operator":
                sent.append(json_format.MessageToDict(request.object)["values"])
            return register(request)

        mon.RegisterResource = register_resource
        return mon

    mp = pytest.MonkeyPatch()
    mp.setattr(plan_module, "_make_monitor", monitor)
    try:
        plan_module.run_program(plan_module.load_stack("prod"))
    finally:
        mp.undo()
    assert len(sent) == 1
    return sent[0]


def test_operator_has_no_cpu_limit_once_helm_merges_the_chart_defaults(operator_values_sent, schemas_dir):
    merged = helm_coalesce(operator_values_sent, chart_defaults("kuberay-operator", KUBERAY_OPERATOR.version))
    assert merged["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


def test_helm_merge_keeps_a_chart_default_that_is_left_out(schemas_dir):
    """Why `cpu: null`: without it the chart's 100m CPU limit survives the merge."""
    defaults = chart_defaults("kuberay-operator", KUBERAY_OPERATOR.version)
    assert defaults["resources"]["limits"]["cpu"] == "100m"
    left_out = helm_coalesce({"resources": {"limits": {"memory": "512Mi"}}}, defaults)
    assert left_out["resources"]["limits"] == {"cpu": "100m", "memory": "512Mi"}
