"""Kueue's admission, transcribed (no Kubernetes, no torch): the quota tree, fair sharing, preemption, the
flavor scan and the scheduling cycle, one module each, named for what it transcribes.

Source: kubernetes-sigs/kueue tag v0.19.2 (:data:`infra.charts.KUEUE_TAG`), Apache-2.0. Transcribed for
what the stack uses: ClusterQueues in a Cohort tree, ``nominalQuota`` / ``borrowingLimit`` / ``lendingLimit`` per
flavor and resource, a Workload's pod sets admitted all at once (all-or-nothing: ``count`` × the per-pod requests),
preemption (``withinClusterQueue``, ``reclaimWithinCohort``, ``borrowWithinCohort``) and fair sharing (weights,
the dominant resource share, DRS). Imports run one way:

- :mod:`bench.kueue.quota`: quantities and the resource tree (``pkg/cache/scheduler/resource_node.go``);
- :mod:`bench.kueue.fair_sharing`: the DRS (``pkg/cache/scheduler/fair_sharing.go``);
- :mod:`bench.kueue.cluster`: Workloads, ClusterQueues and the snapshot built from manifests;
- :mod:`bench.kueue.preemption`: classical and fair-sharing preemption (``pkg/scheduler/preemption``);
- :mod:`bench.kueue.flavor_assigner`: the flavor scan (``pkg/scheduler/flavorassigner``);
- :mod:`bench.kueue.scheduler`: the queue manager and the cycle (``pkg/scheduler/scheduler.go``).

Feature gates at their v0.19.2 defaults (``pkg/features/kube_features.go``): PrioritySortingWithinCohort,
FairSharingPreemptWithinNominal and FairSharingPrioritizeNonBorrowing on, PrioritizePreemptorWorkloads off;
Topology-Aware Scheduling, admission checks, partial admission, AdmissionFairSharing and elastic
workload slices are not transcribed (the stack uses none of them).

The unit tests (tests/bench/kueue/) replay cases of Kueue's own tests at the same tag.
"""
