"""bench/kueue/cluster.py: ClusterQueue manifests the transcription refuses, with the field named."""

from __future__ import annotations

import pytest

from bench.kueue.cluster import Cluster
from tests.support.kueue import cq


def test_cluster_queue_manifest_errors_name_the_field():
    with pytest.raises(ValueError, match=r"spec.cohort: v1beta2 names it spec.cohortName"):
        Cluster([{"metadata": {"name": "x"}, "spec": {"cohort": "pool"}}])
    bad = cq("x", {"default": {"cpu": ("2", "", "3")}})
    with pytest.raises(ValueError, match=r"ClusterQueue x spec.resourceGroups\[0\].flavors\[0\].resources\[0\].lendingLimit"):
        Cluster([bad])
    with pytest.raises(ValueError, match=r"spec.preemption.withinClusterQueue: 'Sometimes'"):
        Cluster([cq("x", {"default": {"cpu": ("2",)}}, within="Sometimes")])
