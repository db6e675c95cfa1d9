"""The GPU keys of the stack config: gpuAmiAlias, gpuPools and the trainingTeams that share the pools' GPUs.

:class:`GpuPoolConfig` and :class:`TeamConfig`, and :func:`parse_gpu`, which validates the three keys
(infra/config.py calls it from parse).
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

from contract.names import TEAM_NAMESPACE_PREFIX
from infra.config_reader import Reader, check, is_int, shown_key
from infra.config_schema import CAPACITY_TYPES, GPU_INSTANCE_FAMILIES, is_gpu_instance_type

# Identifier rules. Always applied with fullmatch: re.match(r"...$") accepts a trailing newline.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,30}[a-z0-9])?")
_DURATION = re.compile(r"Never|(\d{1,6}h)?(\d{1,6}m)?(\d{1,6}s)?")
_BUDGET = re.compile(r"\d{1,6}|\d{1,3}%")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh", "karpenter.k8s.aws", "ragpool.io")


@dataclass(frozen=True)
class GpuPoolConfig:
    name: str
    instance_types: tuple[str, ...]
    capacity_type: str
    gpu_limit: int
    zones: tuple[str, ...]
    disk_size_gib: int = 200
    labels: tuple[tuple[str, str], ...] = ()
    weight: int = 10
    expire_after: str = "720h"
    consolidate_after: str = "30m"
    disruption_budget: str = "10%"
    gpus_per_worker: int = 1
    checkpoint_seconds: int | None = None
    """How long one checkpoint of the largest run trained here takes (``checkpointSeconds``, measured:
    ``ragpool_checkpoint_duration_seconds``); None: not declared, the grace periods below are kept."""


# What a training pod on a GPU pool gets between SIGTERM and SIGKILL (docs/DESIGN.md "Spot notice timing").
SPOT_NOTICE_S = 120
"""EC2 reclaims a spot instance 2 minutes after its interruption warning."""
SPOT_NOTICE_DELIVERY_S = 10
"""Margin for the warning to reach the pod: EventBridge -> the interruption queue -> Karpenter's SQS poll -> NodeClaim
delete -> drain -> pod delete (aws/karpenter-provider-aws v1.14.1 pkg/controllers/interruption/utils.go: a spot
warning is CordonAndDrain, the NodeClaim is deleted at once)."""
SPOT_GRACE_S = SPOT_NOTICE_S - SPOT_NOTICE_DELIVERY_S
"""A spot pool's NodePool ``terminationGracePeriod`` and its worker pods' ``terminationGracePeriodSeconds``. The
NodePool's must be set this short: the worker pods carry ``karpenter.sh/do-not-disrupt``, which Karpenter's drain
does not evict (kubernetes-sigs/karpenter pkg/utils/pod/scheduling.go ``IsEvictable``); it deletes them only at
``node deletion + terminationGracePeriod - the pod's terminationGracePeriodSeconds`` (terminator.go
``DeleteExpiringPods``), so with 24h they would get no SIGTERM before EC2 took the instance. Longer buys nothing:
the instance is gone at 120 s."""
TERMINATION_GRACE_S = 300
"""An on-demand pool's worker pods' ``terminationGracePeriodSeconds`` (no 2-minute limit there)."""
NODE_TERMINATION_GRACE = "24h"
"""An on-demand NodePool's ``terminationGracePeriod``: how long an expiring node may wait for do-not-disrupt pods."""
STOP_MARGIN_S = 15
"""The worker's margin inside its pod's grace period: after the run's checkpoint it hands the run back
(``--stop-grace-seconds`` = grace - this)."""


def sigterm_checkpoint_s(checkpoint_s: int) -> int:
    """The longest a SIGTERM checkpoint can take when one checkpoint takes ``checkpoint_s``: a background
    (``checkpoint.async_save``, the default) save may have begun just before the notice, and the SIGTERM save waits
    for its commit before writing the SIGTERM step (training/components/checkpoint.py ``save_dcp``): two saves."""
    return 2 * checkpoint_s


def pod_grace_seconds(pool: GpuPoolConfig) -> int:
    """The worker pods' ``terminationGracePeriodSeconds`` on ``pool``: :data:`SPOT_GRACE_S` on spot; on on-demand
    :data:`TERMINATION_GRACE_S`, or longer when the declared checkpoint needs it."""
    if pool.capacity_type == "spot":
        return SPOT_GRACE_S
    return max(TERMINATION_GRACE_S, sigterm_checkpoint_s(pool.checkpoint_seconds or 0) + STOP_MARGIN_S)


def node_termination_grace(pool: GpuPoolConfig) -> str:
    """The pool's NodePool ``spec.template.spec.terminationGracePeriod`` (see :data:`SPOT_GRACE_S`)."""
    return f"{SPOT_GRACE_S}s" if pool.capacity_type == "spot" else NODE_TERMINATION_GRACE


@dataclass(frozen=True)
class TeamConfig:
    name: str
    gpu_quota: int
    borrowing_limit: int | None = None
    """GPUs the team's ClusterQueue may borrow beyond gpu_quota from the cohort (``borrowingLimit``); None: no limit."""
    lending_limit: int | None = None
    """Of its gpu_quota, the GPUs others may borrow while idle (``lendingLimit``); None: all of them."""
    fair_share_weight: int = 1
    """The ClusterQueue's ``fairSharing.weight`` (``fairShareWeight``)."""

    @property
    def namespace(self) -> str:
        return f"{TEAM_NAMESPACE_PREFIX}{self.name}"


# gpuPools[] field -> GpuPoolConfig attribute; the dataclass holds the defaults of the optional ones.
_POOL_FIELDS = {
    "name": "name", "instanceTypes": "instance_types", "capacityType": "capacity_type", "gpuLimit": "gpu_limit",
    "zones": "zones", "diskSizeGiB": "disk_size_gib", "labels": "labels", "weight": "weight",
    "expireAfter": "expire_after", "consolidateAfter": "consolidate_after", "disruptionBudget": "disruption_budget",
    "gpusPerWorker": "gpus_per_worker", "checkpointSeconds": "checkpoint_seconds",
}
_POOL_DEFAULTS = {f.name: f.default for f in fields(GpuPoolConfig) if f.default is not MISSING}


def _pool_value(p: Mapping[str, Any], key: str) -> Any:
    """A pool field as written, else GpuPoolConfig's default in the stack file's shape (a map for labels, a list).

    ``zones`` has no default there: absent (empty), the pool spans every availabilityZone.
    """
    if key in p:
        return p[key]
    default = _POOL_DEFAULTS.get(_POOL_FIELDS[key], ())
    if key == "labels":
        return dict(default)
    return list(default) if isinstance(default, tuple) else default


def _parse_gpu_pools(r: Reader, pools: Any, zones: tuple[str, ...]) -> tuple[GpuPoolConfig, ...]:
    key = "gpuPools"
    if not isinstance(pools, list) or not pools:
        r.problem(key, pools, "must be a non-empty list of pool objects, e.g. [{name: gpu-spot, instanceTypes: [g5.xlarge], capacityType: spot, gpuLimit: 8}]")
        return ()
    out: list[GpuPoolConfig] = []
    seen: set[str] = set()
    for i, p in enumerate(pools):
        at = f"{key}[{i}]"
        if not isinstance(p, dict):
            r.problem(at, p, "must be an object with name, instanceTypes, capacityType and gpuLimit")
            continue
        before = len(r.problems)
        pool = _parse_pool(r, at, p, zones, seen)
        if len(r.problems) == before:
            out.append(pool)
    return tuple(out)


def _parse_pool(r: Reader, at: str, p: Mapping[Any, Any], zones: tuple[str, ...], seen: set[str]) -> GpuPoolConfig | None:
    """One gpuPools[] entry; problems are recorded on ``r`` (the result is only used when there were none)."""
    for unknown in sorted(set(p) - set(_POOL_FIELDS), key=str):
        r.problem(f"{at}.{shown_key(unknown)}", p[unknown], "unknown pool field; allowed: " + ", ".join(sorted(_POOL_FIELDS)))
    name = p.get("name")
    if check(isinstance(name, str) and bool(_DNS_LABEL.fullmatch(name)), r, f"{at}.name", name,
             "must be a lowercase DNS label of at most 32 characters (a-z, 0-9, -)"):
        check(name not in seen, r, f"{at}.name", name, "pool names must be unique")
        seen.add(name)
    itypes = p.get("instanceTypes")
    if check(isinstance(itypes, list) and bool(itypes) and all(isinstance(t, str) for t in itypes),
             r, f"{at}.instanceTypes", itypes, "must be a non-empty list of EC2 instance types"):
        for t in itypes:
            check(is_gpu_instance_type(t), r, f"{at}.instanceTypes", t,
                  "is not an NVIDIA GPU instance type; allowed families: " + ", ".join(GPU_INSTANCE_FAMILIES))
    cap = p.get("capacityType")
    check(cap in CAPACITY_TYPES, r, f"{at}.capacityType", cap, "must be one of " + ", ".join(CAPACITY_TYPES))
    limit = p.get("gpuLimit")
    check(is_int(limit, 1, 4096), r, f"{at}.gpuLimit", limit,
          "must be an integer from 1 to 4096 (the most GPUs this pool may run at once)")
    pzones = _pool_value(p, "zones")
    if check(isinstance(pzones, list) and all(isinstance(z, str) for z in pzones), r, f"{at}.zones", pzones,
             "must be a list of availability zones"):
        for z in pzones:
            check(z in zones, r, f"{at}.zones", z, "must be one of availabilityZones: " + ", ".join(zones))
    disk = _pool_value(p, "diskSizeGiB")
    check(is_int(disk, 50, 16384), r, f"{at}.diskSizeGiB", disk,
          "must be an integer from 50 to 16384 (GPU images and datasets need room)")
    labels = _pool_value(p, "labels")
    if check(isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()),
             r, f"{at}.labels", labels, "must be a map of label key to string value"):
        for lk, lv in labels.items():
            domain = lk.split("/", 1)[0] if "/" in lk else ""
            check(bool(_LABEL_KEY.fullmatch(lk)) and not any(domain == d or domain.endswith("." + d) for d in _RESERVED_LABEL_DOMAINS),
                  r, f"{at}.labels", lk, "must be a valid label key outside the reserved domains " + ", ".join(_RESERVED_LABEL_DOMAINS))
            check(bool(_LABEL_VALUE.fullmatch(lv)), r, f"{at}.labels.{shown_key(lk)}", lv,
                  "must be a Kubernetes label value: at most 63 of A-Z a-z 0-9 - _ . , starting and ending alphanumeric")
    weight = _pool_value(p, "weight")
    check(is_int(weight, 0, 100), r, f"{at}.weight", weight,
          "must be an integer from 0 to 100 (higher pools are tried first)")
    for fld in ("expireAfter", "consolidateAfter"):
        v = _pool_value(p, fld)
        check(isinstance(v, str) and v != "" and bool(_DURATION.fullmatch(v)), r, f"{at}.{fld}", v,
              "must be a Go duration like 720h, 30m or Never")
    per_worker = _pool_value(p, "gpusPerWorker")
    check(is_int(per_worker, 1, 8), r,
          f"{at}.gpusPerWorker", per_worker, "must be an integer from 1 to 8 (GPUs one worker pod requests)")
    ckpt = p.get("checkpointSeconds")  # left out: not declared (None); written, it must be a number
    if check("checkpointSeconds" not in p or is_int(ckpt, 1, 3600), r, f"{at}.checkpointSeconds", ckpt,
             "must be an integer from 1 to 3600 (seconds the SIGTERM checkpoint takes), or left out") \
            and ckpt is not None and cap == "spot":
        budget = SPOT_GRACE_S - STOP_MARGIN_S
        check(sigterm_checkpoint_s(ckpt) <= budget, r, f"{at}.checkpointSeconds", ckpt,
              f"a spot pool's checkpoint must fit the spot notice: EC2 reclaims the instance {SPOT_NOTICE_S} s after "
              f"its warning, the pod gets SIGTERM within {SPOT_NOTICE_DELIVERY_S} s of it and the worker needs "
              f"{STOP_MARGIN_S} s to hand the run back, leaving {budget} s for the background save in flight and the "
              f"SIGTERM save after it, so at most {budget // 2} s each; train this model on an on-demand pool, or "
              "shard it over more nodes (each writes a smaller share)")
    budget = _pool_value(p, "disruptionBudget")
    check(isinstance(budget, str) and bool(_BUDGET.fullmatch(budget)), r, f"{at}.disruptionBudget", budget,
          "must be a node count or percentage string, e.g. \"1\" or \"10%\"")
    try:
        return GpuPoolConfig(
            name=name, instance_types=tuple(itypes), capacity_type=cap, gpu_limit=limit,
            zones=tuple(pzones) or zones, disk_size_gib=disk, labels=tuple(sorted(labels.items())),
            weight=weight, expire_after=_pool_value(p, "expireAfter"),
            consolidate_after=_pool_value(p, "consolidateAfter"), disruption_budget=budget,
            gpus_per_worker=per_worker, checkpoint_seconds=ckpt,
        )
    except (TypeError, AttributeError):  # only with problems recorded above
        return None


_TEAM_FIELDS = ("name", "gpuQuota", "borrowingLimit", "lendingLimit", "fairShareWeight")
FAIR_SHARE_WEIGHT_MAX = 1000


def _parse_teams(r: Reader, teams: Any, gpu_total: int) -> tuple[TeamConfig, ...]:
    key = "trainingTeams"
    if not isinstance(teams, list):
        r.problem(key, teams, "must be a list of {name, gpuQuota} objects")
        return ()
    out, seen = [], set()
    for i, t in enumerate(teams):
        at = f"{key}[{i}]"
        if not isinstance(t, dict) or set(t) - set(_TEAM_FIELDS):
            r.problem(at, t, "must be an object with name and gpuQuota, and optionally borrowingLimit, lendingLimit "
                             "and fairShareWeight")
            continue
        name, quota = t.get("name"), t.get("gpuQuota")
        ok = check(isinstance(name, str) and bool(re.fullmatch(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?", name)) and
                   name not in seen, r, f"{at}.name", name, "must be a unique lowercase DNS label of at most 20 characters")
        ok &= check(is_int(quota, 1, max(gpu_total, 1)), r,
                    f"{at}.gpuQuota", quota, f"must be an integer from 1 to the pools' total GPU limit ({gpu_total})")
        borrow, lend = t.get("borrowingLimit"), t.get("lendingLimit")
        ok &= check(borrow is None or is_int(borrow, 0, gpu_total), r, f"{at}.borrowingLimit", borrow,
                    f"must be an integer from 0 to the pools' total GPU limit ({gpu_total}), or left out (no limit)")
        ok &= check(lend is None or (is_int(lend, 0, gpu_total) and (not is_int(quota, 1, gpu_total) or lend <= quota)),
                    r, f"{at}.lendingLimit", lend,
                    f"must be an integer from 0 to the team's gpuQuota ({quota}), or left out (lends all its idle GPUs)")
        weight = t.get("fairShareWeight", TeamConfig.fair_share_weight)
        ok &= check(is_int(weight, 1, FAIR_SHARE_WEIGHT_MAX), r, f"{at}.fairShareWeight", weight,
                    f"must be an integer from 1 to {FAIR_SHARE_WEIGHT_MAX} (default 1)")
        if ok:
            seen.add(name)
            out.append(TeamConfig(name=name, gpu_quota=quota, borrowing_limit=borrow, lending_limit=lend,
                                  fair_share_weight=weight))
    total = sum(t.gpu_quota for t in out)
    check(total <= gpu_total, r, key, [t.name for t in out],
          f"the teams' gpuQuota total ({total}) must not exceed the pools' total GPU limit ({gpu_total}): "
          "Kueue's nominal quotas share those GPUs; lower a gpuQuota or raise a pool's gpuLimit")
    return tuple(out)


def parse_gpu(r: Reader, prod: bool, zones: tuple[str, ...]) -> dict[str, Any]:
    """gpuAmiAlias, gpuPools and the trainingTeams that share the pools' GPUs."""
    ami = r.get("gpuAmiAlias")
    check(isinstance(ami, str) and bool(re.fullmatch(r"(al2023|bottlerocket)@(latest|v\d{8}|\d+\.\d+\.\d+)", ami or "")),
          r, "gpuAmiAlias", ami, "must be an AMI alias like al2023@latest, al2023@v20250101 or bottlerocket@1.30.0")

    pools = _parse_gpu_pools(r, r.get("gpuPools"), zones)
    if prod and pools:
        check(any(p.capacity_type == "on-demand" for p in pools), r, "gpuPools", [p.name for p in pools],
              "prod needs at least one on-demand GPU pool (spot capacity can vanish); add a pool with capacityType: on-demand")

    teams = _parse_teams(r, r.get("trainingTeams"), sum(p.gpu_limit for p in pools))
    return {"gpu_ami_alias": ami, "gpu_pools": pools, "teams": teams}
