"""Every Kubernetes object and Helm value in both stacks, checked against real schemas."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest

from infra.charts import BY_SCHEMA_NAME, SUBCHART_VERSIONS
from infra.config_schema import SUPPORTED_KUBERNETES_VERSIONS
from tests.infra.harness import (
    NON_OBJECT_TYPES, schema_file, helm_releases, helm_value_problems, is_core, subchart_schema_problems, kubernetes_objects, validate_core, validate_custom,
)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_kubernetes_object_validates_strictly(committed_plans, schemas_dir, stack):
    doc = committed_plans[stack]
    version = next(r for r in doc["resources"] if r["type"] == "aws:eks/cluster:Cluster")["inputs"]["version"]
    validated = 0
    for resource, obj in kubernetes_objects(doc):
        if is_core(obj):
            validate_core(obj, version)
        else:
            validate_custom(obj)
        validated += 1
    total = sum(1 for r in doc["resources"] if r["type"].startswith("kubernetes:")
                and r["type"] not in NON_OBJECT_TYPES)
    assert validated == total and total >= 5


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_helm_release_is_pinned_and_its_values_exist_in_the_chart(committed_plans, schemas_dir, stack):
    releases = list(helm_releases(committed_plans[stack]))
    assert releases
    by_ref = {c.chart_ref: (schema_name, c) for schema_name, c in BY_SCHEMA_NAME.items()}
    seen = set()
    for release in releases:
        inputs = release["inputs"]
        schema_name, chart = by_ref[inputs["chart"]]
        assert inputs["version"] == chart.version
        assert schema_file("helm", schema_name, chart.version, "values.yaml").is_file(), \
            f"{schema_name} {chart.version} is not the version in vendor/upstream/helm (scripts/vendor_schemas.py)"
        assert helm_value_problems(schema_name, chart.version, inputs["values"],
                                   SUBCHART_VERSIONS.get(schema_name)) == []
        assert subchart_schema_problems(inputs["values"], SUBCHART_VERSIONS.get(schema_name)) == []
        seen.add(schema_name)
    # Every pinned chart is installed and checked; the EFA device plugin only where a pool has EFA (prod).
    assert seen == set(BY_SCHEMA_NAME) - (set() if stack == "prod" else {"aws-efa-k8s-device-plugin"})


def test_harness_rejects_unknown_fields(schemas_dir):
    """The validators must fail on typos, or the tests above prove nothing."""
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}, "spec": {"typo": 1}},
                      SUPPORTED_KUBERNETES_VERSIONS[-1])
    with pytest.raises(jsonschema.ValidationError):
        validate_custom({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "x"},
                         "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws",
                                  "kind": "EC2NodeClass", "name": "x"}, "requirements": [], "taint": []}}}})
    problems = helm_value_problems("karpenter", "1.14.1", {"settings": {"clusterNme": "x"}, "nodeSelector": {"a": "b"}})
    assert problems == ["karpenter: `settings.clusterNme` is not a value of the chart (typo or removed key?)"]


def test_subchart_schema_catches_bad_nfd_values(schemas_dir):
    bad = subchart_schema_problems({"nfd": {"worker": {"tolerations": "all"}}}, {"nfd": "0.19.0"})
    assert bad and "worker.tolerations" in bad[0]


def test_cluster_versions_have_validation_schemas():
    for version in SUPPORTED_KUBERNETES_VERSIONS:
        validate_core({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}, version)
