"""The Job controller's objects and rules in the from-zero simulation (bench/autoscale_sim.py): the ScaledJobs,
Jobs and pods the fake cluster (bench/autoscale_sim_cluster.py) keeps, the events it records, and what the Job
controller does with a failed pod of an Indexed Job (kubernetes/kubernetes pkg/controller/job, transcribed):
``podFailurePolicy`` (:func:`pod_failure_action`), ``podReplacementPolicy`` (:func:`replaces_terminating`),
``backoffLimit``, ``backoffLimitPerIndex``/``maxFailedIndexes`` and the pod back-off (:func:`failed_pod_outcome`)."""

from __future__ import annotations

import random
import string
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bench import keda_scaledjob as keda

POD_BACKOFF_S = 10.0
"""The Job controller's pod back-off after a counted failure (doubles per failure, k8s default)."""


def pod_failure_action(job_spec: dict, code: int, *, container: str = "worker", disrupted: bool = False) -> str:
    """What the Job controller does with a failed pod whose ``container`` exited ``code`` (not 0):
    the action of the first ``podFailurePolicy`` rule that matches, ``Count`` when none does
    (kubernetes/kubernetes pkg/controller/job/pod_failure_policy.go ``matchPodFailurePolicy``;
    ``DisruptionTarget`` is the only pod condition simulated: a lost node)."""
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
        on_codes = rule.get("onExitCodes")
        if on_codes is not None:
            if on_codes.get("containerName") not in (None, container):
                continue
            values = set(on_codes.get("values", []))
            if (code in values) == (on_codes.get("operator", "In") == "In"):
                return rule["action"]
            continue
        for cond in rule.get("onPodConditions", []):
            if cond.get("type") == "DisruptionTarget" and cond.get("status", "True") == "True" and disrupted:
                return rule["action"]
    return "Count"


def replaces_terminating(job_spec: dict) -> bool:
    """``podReplacementPolicy``: TerminatingOrFailed replaces a pod once it is terminating, Failed only once it is
    terminal; Failed is the default, and the only value allowed, with a ``podFailurePolicy`` (the API's JobSpec
    description; kubernetes/kubernetes pkg/controller/job/indexed_job_utils.go ``firstPendingIndexes`` counts a
    terminating pod's index as not pending under Failed)."""
    default = "Failed" if job_spec.get("podFailurePolicy") else "TerminatingOrFailed"
    return job_spec.get("podReplacementPolicy", default) == "TerminatingOrFailed"


@dataclass(frozen=True)
class FailedPod:
    """What the Job controller does after one pod failed (:func:`failed_pod_outcome`)."""

    action: str
    """The ``podFailurePolicy`` action (``Count`` when no rule matched)."""
    counted: bool
    """Counted against ``backoffLimit`` and the index's ``backoffLimitPerIndex`` (every action but Ignore)."""
    index_failed: bool = False
    """The index is failed (``backoffLimitPerIndex``): never replaced; the other indexes go on."""
    job_failed: str | None = None
    """The reason the Job is Failed now, or None."""
    retry_after_s: float | None = None
    """Seconds until the index's replacement pod is created; None: no replacement."""


def failed_pod_outcome(job_spec: dict, code: int, *, disrupted: bool = False, job_failures: int = 0,
                       index_failures: int = 0, index_ignored: int = 0, failed_indexes: int = 0,
                       succeeded: int = 0) -> FailedPod:
    """The Job controller on a failed pod of an Indexed Job (kubernetes/kubernetes pkg/controller/job):
    ``job_failures`` counted failures of the Job before this one; ``index_failures``/``index_ignored`` the failed
    pod's ``batch.kubernetes.io/job-index-failure-count``/``-ignored-failure-count`` annotations (its index's
    counted and ignored failures before it); ``failed_indexes``/``succeeded`` the other indexes' state.

    - ``backoffLimit`` first (job_controller.go ``exceedsBackoffLimit``: counted failures > it; with a
      ``backoffLimitPerIndex`` and no ``backoffLimit`` it defaults to MaxInt32).
    - With ``backoffLimitPerIndex`` (indexed_job_utils.go ``isIndexFailed``): the index fails on a FailIndex rule or
      a counted failure of a pod already at the limit; then the Job fails once the failed indexes exceed
      ``maxFailedIndexes`` (MaxFailedIndexesExceeded), or once every index is failed or succeeded with one failed
      (FailedIndexes). Else the replacement waits 10 s doubling per failure of the index, ignored ones included
      (job_controller.go ``getRemainingTimePerIndex``).
    - Without: the replacement waits 10 s doubling per counted failure of the Job, none for an ignored one."""
    action = pod_failure_action(job_spec, code, disrupted=disrupted)
    if action == "FailJob":
        return FailedPod(action, True, job_failed="PodFailurePolicy")
    counted = action != "Ignore"
    failures = job_failures + counted
    per_index = job_spec.get("backoffLimitPerIndex")
    limit = job_spec.get("backoffLimit", 2**31 - 1 if per_index is not None else 6)
    if failures > int(limit):
        return FailedPod(action, counted, job_failed="BackoffLimitExceeded")
    if per_index is None:
        return FailedPod(action, counted, retry_after_s=POD_BACKOFF_S * 2 ** (failures - 1) if counted else 0.0)
    if action == "FailIndex" or (counted and index_failures >= int(per_index)):
        failed = failed_indexes + 1
        max_failed = job_spec.get("maxFailedIndexes")
        if max_failed is not None and failed > int(max_failed):
            return FailedPod(action, counted, index_failed=True, job_failed="MaxFailedIndexesExceeded")
        if failed + succeeded >= int(job_spec.get("completions", 1)):
            return FailedPod(action, counted, index_failed=True, job_failed="FailedIndexes")
        return FailedPod(action, counted, index_failed=True)
    return FailedPod(action, counted, retry_after_s=POD_BACKOFF_S * 2 ** (index_failures + index_ignored))



# -- pods and Jobs -------------------------------------------------------------------------

@dataclass
class Pod:
    job: "Job"
    index: int
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    created_at: float
    pool: str | None
    gpus: int
    node: str = ""
    phase: str = "Pending"
    proc: subprocess.Popen | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    ready: bool = False
    ready_at: float | None = None
    disrupted: bool = False
    """Lost with its node (the pod gets a DisruptionTarget condition)."""
    drained: bool = False
    """Its node drained (a spot notice): terminating while the Job goes on (:meth:`Simulation.drain_node_of`)."""
    index_failures: tuple[int, int] = (0, 0)
    """Its index's counted and ignored failures before it (the ``job-index-failure-count`` annotations)."""
    probe_url: str | None = None
    next_probe_at: float = 0.0
    deleting_since: float | None = None
    log_path: Path | None = None

    def view(self) -> keda.PodView:
        conditions = {"PodScheduled"} if self.node else set()
        if self.ready:
            conditions.add("Ready")
        if self.disrupted:
            conditions.add("DisruptionTarget")
        return keda.PodView(self.phase, frozenset(conditions))


@dataclass
class Job:
    scaled_job: "ScaledJob"
    name: str
    created_at: float
    spec: dict
    pods: list[Pod] = field(default_factory=list)
    succeeded: set[int] = field(default_factory=set)
    failures: int = 0
    condition: str | None = None
    """``Complete`` or ``Failed`` once finished."""
    finished_at: float | None = None
    retry_at: dict[int, float] = field(default_factory=dict)
    failed_indexes: set[int] = field(default_factory=set)
    """Indexes failed by ``backoffLimitPerIndex``: never replaced."""
    index_failures: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Index -> its counted and ignored pod failures (what its next pod's annotations carry)."""
    suspended: bool = False
    """``spec.suspend``: under Kueue (:mod:`bench.kueue_gate`) until admitted, and again once evicted."""
    labels: dict[str, str] = field(default_factory=dict)
    """The Job's own labels (:func:`bench.autoscale_sim_plan.job_labels`: its ScaledJob's, as KEDA copies them)."""

    @property
    def namespace(self) -> str:
        return self.scaled_job.namespace

    @property
    def finished(self) -> bool:
        return self.condition is not None

    def active_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.phase in ("Pending", "Running")]


@dataclass
class ScaledJob:
    """One ScaledJob object (``keda.sh/v1alpha1``) as infra declares it."""

    manifest: dict
    jobs: list[Job] = field(default_factory=list)
    next_poll_at: float = 0.0
    polls: int = 0
    errors: int = 0
    at_max: list[float] = field(default_factory=list)
    """When a poll left the ScaledJob at its ``maxReplicaCount`` (unfinished Jobs after it created
    its Jobs): a run still without a Job then waits for capacity, not for KEDA."""

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.manifest["metadata"].get("namespace", "default")

    @property
    def spec(self) -> dict:
        return self.manifest["spec"]

    def unfinished(self) -> list[Job]:
        return [j for j in self.jobs if not j.finished]


@dataclass
class Event:
    at: float
    kind: str
    """``job-created``, ``job-finished``, ``pod-started``, ``pod-ready``, ``pod-exited``, ``pod-lost``."""
    scaled_job: str
    job: str
    detail: dict = field(default_factory=dict)


def random_suffix(n: int = 5) -> str:
    """``n`` random lowercase letters and digits (a generated name's suffix, a password)."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=n))
