"""Kueue v1beta2 manifests and Workloads for the tests of bench/kueue/, built like upstream's test wrappers
(``MakeClusterQueue``, ``MakeFlavorQuotas``, ``MakeWorkload``) so a replayed case reads like its source."""

from __future__ import annotations

from bench.kueue.cluster import PodSet, Workload
from bench.kueue.quota import amount


def cq(name: str, flavors: dict[str, dict[str, tuple]], *, cohort: str | None = None, within: str | None = None,
       reclaim: str | None = None, borrow_within: dict | None = None, weight=None) -> dict:
    """A v1beta2 ClusterQueue manifest; ``flavors``: flavor -> resource -> (nominal, borrowingLimit,
    lendingLimit) like upstream's ``MakeFlavorQuotas(...).Resource(name, qs...)`` ("" or missing: unset)."""
    resources = sorted({r for f in flavors.values() for r in f})
    group = {"coveredResources": resources, "flavors": []}
    for fname, res in flavors.items():
        entries = []
        for rname, qs in res.items():
            entry = {"name": rname, "nominalQuota": qs[0]}
            for key, value in zip(("borrowingLimit", "lendingLimit"), qs[1:]):
                if value != "":
                    entry[key] = value
            entries.append(entry)
        group["flavors"].append({"name": fname, "resources": entries})
    spec: dict = {"resourceGroups": [group]}
    if cohort:
        spec["cohortName"] = cohort
    preemption = {k: v for k, v in (("withinClusterQueue", within), ("reclaimWithinCohort", reclaim),
                                    ("borrowWithinCohort", borrow_within)) if v is not None}
    if preemption:
        spec["preemption"] = preemption
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


LP, ANY, NEVER = "LowerPriority", "Any", "Never"


def wl(name: str, cq_name: str, *, priority: int = 0, count: int = 1, flavor: str | None = "default",
       **requests) -> Workload:
    """``MakeWorkload(name).Priority(p).Request(...)``; with ``flavor`` its quota is reserved in
    that flavor (``SimpleReserveQuota``); ``requests`` as quantities (``cpu="2"``, ``memory="2Gi"``)."""
    reqs = {r: amount(r, q) for r, q in requests.items()}
    return Workload(name, cq_name, [PodSet(count, reqs)], priority=priority, uid=name,
                    flavors={r: flavor for r in reqs} if flavor else None)
