"""bench/kueue/fair_sharing.py against ``pkg/cache/scheduler/fair_sharing_test.go``
``TestDominantResourceShare`` of Kueue's own tests at the pinned tag (v0.19.2): DRS values; each test
names its upstream case."""

from __future__ import annotations

import pytest

from bench.kueue.cluster import Cluster
from bench.kueue.fair_sharing import dominant_resource_share
from tests.support.kueue import cq

GPU = "example.com/gpu"


def drs_case(cq_weight, lending_gpu: str, usage: dict[str, int], cpu: bool = True) -> tuple[int, str]:
    res = {"cpu": ("2",), GPU: ("5",)} if cpu else {GPU: ("5",)}
    lend = {"cpu": ("8",), GPU: (lending_gpu,)} if cpu else {GPU: (lending_gpu,)}
    cluster = Cluster([cq("cq", {"default": res}, cohort="test-cohort", weight=cq_weight),
                       cq("lending-cq", {"default": lend}, cohort="test-cohort", weight="1")])
    cluster.cqs["cq"].add_usage({("default", r): v for r, v in usage.items()})
    assert dominant_resource_share(cluster.cqs["lending-cq"], {}).rounded_weighted_share() == (0, "")
    assert dominant_resource_share(cluster.cohorts["test-cohort"], {}).rounded_weighted_share() == (0, "")
    return dominant_resource_share(cluster.cqs["cq"], {}).rounded_weighted_share()


@pytest.mark.parametrize("case, args, want", [
    ("usage below nominal", ("1", "5", {"cpu": 1000, GPU: 2}), (0, "")),
    ("usage above nominal", ("1", "5", {"cpu": 3000, GPU: 7}), (200, GPU)),  # (7-5)*1000/10
    ("above nominal with integer weight", ("2", "5", {GPU: 7}, False), (100, GPU)),
    ("above nominal with decimal weight", ("0.5", "5", {GPU: 7}, False), (400, GPU)),
    ("above nominal with zero weight", ("0", "10", {GPU: 7}, False), (2**63 - 1, GPU)),
])
def test_dominant_resource_share(case, args, want):
    assert drs_case(*args) == want, case


def test_dominant_resource_share_affected_by_borrowing_limit():  # "resource share affected by borrowing limit"
    cohorts = [{"metadata": {"name": "child-cohort"}, "spec": {"parentName": "root", "resourceGroups": [
                   {"coveredResources": [GPU], "flavors": [{"name": "default", "resources": [
                       {"name": GPU, "nominalQuota": "0", "borrowingLimit": "10"}]}]}]}},
               {"metadata": {"name": "root"}, "spec": {"resourceGroups": [
                   {"coveredResources": [GPU], "flavors": [{"name": "default", "resources": [
                       {"name": GPU, "nominalQuota": "50"}]}]}]}}]
    cluster = Cluster([cq("cq", {"default": {GPU: ("0",)}}, cohort="child-cohort")], cohorts)
    cluster.cqs["cq"].add_usage({("default", GPU): 10})
    assert dominant_resource_share(cluster.cqs["cq"], {}).rounded_weighted_share() == (1000, GPU)
    assert dominant_resource_share(cluster.cohorts["child-cohort"], {}).rounded_weighted_share() == (200, GPU)
    assert dominant_resource_share(cluster.cohorts["root"], {}).rounded_weighted_share() == (0, "")
