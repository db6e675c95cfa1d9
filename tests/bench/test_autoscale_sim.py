"""The pool from zero (issue 22), simulated: the dev stack's ScaledJobs from the offline plan,
KEDA's job-count algorithm (bench/keda_scaledjob.py), a fake Job controller whose pods are real
``python -m training.worker`` processes, a real redis-server and the real keeper Deployment
(bench/autoscale_sim.py). Each scenario starts from 0 Jobs and ends at 0."""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Any

import pytest

from bench.autoscale import burst_runs, lose_a_node
from bench.autoscale_sim import Simulation, Submitted
from bench.autoscale_sim_jobs import POD_BACKOFF_S, Job, ScaledJob, failed_pod_outcome, replaces_terminating
from bench.autoscale_sim_plan import (
    Settings, container_env, lanes_of, localize, queue_namespace, set_flag, stack_from_plan,
)
from tests.support.redis_fixtures import requires_redis
from contract import exit_codes
from contract.lanes import DEFAULT_PRIORITY, LANES_ENV, PRIORITIES_ENV, Lane, format_lanes
from training.scheduler.queue_records import GANG_TIMEOUTS_STAT, Key


TEAM, TEAM_QUOTA = "a", 2
TEAM_NAMESPACE = f"ragpool-team-{TEAM}"
MAIN_NAMESPACE = "ragpool-training"
SETTINGS = Settings()
SETTLE_S = 240.0


@pytest.fixture(scope="module")
def plan():
    from infra.plan import plan as make_plan

    # borrowingLimit 0: the team reaches its nominal quota only (Kueue borrowing: bench/fair_share.py).
    return make_plan("dev", overrides={"trainingTeams": [{"name": TEAM, "gpuQuota": TEAM_QUOTA, "borrowingLimit": 0}]})


def of_default_priority(manifest: dict) -> bool:
    """The ScaledJob starts workers for runs of the default priority (the runs these tests submit): one per (kind,
    priority), infra/keda.py ``PRIORITY_SCALED_JOBS``; or one for every priority."""
    return container_env(manifest, PRIORITIES_ENV) in (None, DEFAULT_PRIORITY)


def the_scaled_job(stack, *, nodes: int) -> dict:
    """The GPU ScaledJob of the default pool whose Jobs have ``nodes`` pods, for runs of the default priority."""
    return next(m for m in stack.scaled_jobs if of_default_priority(m)
                and all(lane.executor == "torchrun" and lane.nodes == nodes for lane in lanes_of(m)))


def assert_within_bounds(sim: Simulation) -> None:
    for sj in sim.cluster.scaled_jobs:
        assert sim.cluster.max_unfinished[sj.name] <= sj.spec["maxReplicaCount"], (
            f"{sj.name}: {sim.cluster.max_unfinished[sj.name]} Jobs at once, maxReplicaCount {sj.spec['maxReplicaCount']}")
    for namespace, gpus in sim.cluster.max_gpus.items():
        assert gpus <= sim.stack.gpu_quotas[namespace], f"{namespace}: {gpus} GPUs at once"


def assert_each_run_once(sim: Simulation, run_ids) -> None:
    for run_id in run_ids:
        info = sim.info(run_id)
        assert info.state == "succeeded" and info.completions == 1, (run_id, info)
        for node in range(sim.submitted[run_id].nodes):
            assert sim.executions(run_id, node) == 1, (run_id, node, sim.run_log(run_id))


def test_submit_to_job_counts_runs_by_kedas_jobs_and_splits_off_capacity_waits():
    """Per ScaledJob the k-th run submitted is matched with the k-th Job created from then on (a Job
    is one run): a run is never 0 s because a Job started earlier (for other work) took it, and a
    run that waited because the lane was at maxReplicaCount is reported apart."""
    lane = Lane()
    manifest = {"metadata": {"name": "w"}, "spec": {"maxReplicaCount": 2, "jobTargetRef": {"template": {"spec": {
        "containers": [{"env": [{"name": LANES_ENV, "value": format_lanes([lane])}]}]}}}}}
    sim = Simulation.__new__(Simulation)
    sj = ScaledJob(manifest)
    t0 = 1000.0
    earlier = Job(sj, "w-earlier", t0 - 30, {})  # started for work submitted before the burst
    jobs = [Job(sj, f"w-{i}", at, {}) for i, at in enumerate([t0 + 1, t0 + 1, t0 + 9])]
    sj.at_max = [t0 + 1, t0 + 3, t0 + 5, t0 + 7]  # polls that left it at 2 Jobs
    sim.cluster = types.SimpleNamespace(scaled_jobs=[sj], created=[earlier, *jobs])
    sim.submitted = {f"r{i}": Submitted(f"r{i}", "ragpool", t0 + i * 0.01, 1, lane) for i in range(3)}
    to_job, capacity = sim.job_delays(list(sim.submitted))
    assert [round(d, 2) for d in to_job] == [1.0, 0.99]
    assert [round(d, 2) for d in capacity] == [8.98]
    # A run with no Job of its own waits until now: never 0 s.
    sim.submitted["r3"] = Submitted("r3", "ragpool", t0 + 0.5, 1, lane)
    sim.cluster.created = [earlier, *jobs]
    _, capacity = sim.job_delays(list(sim.submitted))
    assert len(capacity) == 2 and capacity[-1] > 1000, capacity


@pytest.mark.slow
def test_localize_changes_only_the_timing_settings(plan):
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    manifest = the_scaled_job(stack, nodes=1)
    local = localize(manifest, SETTINGS)
    args = local["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--lease-seconds") + 1] == f"{SETTINGS.lease_s:g}"
    assert args[args.index("--health-check-timeout-seconds") + 1] == "0"
    assert local["spec"]["pollingInterval"] == SETTINGS.polling_interval_s
    local["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]["args"] = \
        manifest["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]["args"]
    local["spec"]["pollingInterval"] = manifest["spec"]["pollingInterval"]
    assert local == manifest
    assert set_flag(["--a", "1"], "--a", "2") == ["--a", "2"] and set_flag([], "--b", "3") == ["--b", "3"]


@pytest.mark.slow
@requires_redis
def test_a_burst_from_zero_runs_every_run_once_within_bounds_and_ends_at_zero(plan, tmp_path):
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    assert stack.keeper is not None, "the plan declares no keeper Deployment"
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        assert sim.cluster.unfinished_jobs() == 0
        run_ids = burst_runs(sim, stack.scaled_jobs, 20)
        assert {sim.submitted[r].nodes for r in run_ids} == {1, 2}
        assert len({sim.queue(queue_namespace(stack.scaled_jobs[0])).get(r).priority for r in run_ids}) == 3
        sim.settle(SETTLE_S)
        assert_each_run_once(sim, run_ids)
        assert_within_bounds(sim)
        # Mixed lanes really went through different ScaledJobs, and more than one Job ran at once.
        created = [e for e in sim.cluster.events if e.kind == "job-created"]
        assert len({e.scaled_job for e in created}) >= 2, [e.scaled_job for e in created]
        assert max(sim.cluster.max_unfinished.values()) >= 2
        assert sim.cluster.unfinished_jobs() == 0 and not sim.cluster.live_pods()
        assert not sim.cluster.errors


@pytest.mark.slow
@requires_redis
def test_a_lost_worker_is_replaced_and_the_run_resumes_from_its_checkpoint(plan, tmp_path):
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        lost = lose_a_node(sim, stack.scaled_jobs)
        info = sim.info("lost-node")
        assert info.state == "succeeded" and info.attempts == 2 and info.completions == 1, info
        assert lost["checkpoint_at_kill"] >= 3
        assert lost["resumed_from_step"] >= lost["checkpoint_at_kill"], sim.run_log("lost-node")
        assert sim.executions("lost-node") == 1
        pods = sim.claimer_pods("lost-node")
        assert len(pods) == 2 and pods[0] != pods[1]
        # The goal is lease + interval + 5 s; on these shared cores allow 10 s more.
        assert lost["replacement_s"] <= SETTINGS.lease_s + SETTINGS.polling_interval_s + 15, lost
        assert sim.cluster.unfinished_jobs() == 0


@pytest.mark.slow
@requires_redis
def test_a_retry_that_comes_due_with_no_worker_left_gets_a_new_job(plan, tmp_path):
    """Attempt 1 fails; its worker exits idle before the back-off is over, so no Job is left. The
    keeper moves the due retry back to the lane's ready list and KEDA starts a Job for it."""
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        namespace = queue_namespace(the_scaled_job(stack, nodes=1))
        sim.submit(namespace, "retried", fail_attempts=[1])
        sim.wait_for(lambda: sim.info("retried").state == "failed", 60, "attempt 1 to fail")
        first = sim.cluster.pod_named(sim.info("retried").worker)
        sim.wait_for(lambda: sim.cluster.unfinished_jobs() == 0, 30, "the worker to exit with nothing to claim")
        zero_at = time.time()
        assert sim.info("retried").state == "failed", "the retry came due before the pool was at zero"
        sim.settle(SETTLE_S)
        info = sim.info("retried")
        assert info.state == "succeeded" and info.attempts == 2 and info.completions == 1, info
        second = sim.cluster.pod_named(sim.claimer_pods("retried")[-1])
        assert second.job is not first.job and second.job.created_at > zero_at
        assert sim.cluster.unfinished_jobs() == 0


@pytest.mark.slow
@requires_redis
def test_a_gang_forms_when_index_0_comes_last_and_a_gang_timeout_fails_its_job(plan, tmp_path):
    """Round-4 audit, item 1, from zero. First, index 0's node comes after the followers' idle exit (a cold
    pool's minutes, scaled: 1.5 idle exits, inside the gang deadline): the follower waits the gang deadline and
    the first Job runs the run. Then a follower's node never comes: index 0's gang times out, its exit fails the
    whole Job (podFailurePolicy), the Pending follower with it, and KEDA's next Job runs the run."""
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    gang_jobs = the_scaled_job(stack, nodes=2)
    late = SETTINGS.idle_exit_s * 1.5
    assert SETTINGS.idle_exit_s < late < SETTINGS.gang_deadline_s
    phase: dict[str, Any] = {"earlier_jobs": None, "lost": None}

    def node_delay(pod) -> float:
        """Phase 1: index 0's node comes late. Phase 2: the first new Job's followers get no node."""
        if pod.job.scaled_job.name != gang_jobs["metadata"]["name"]:
            return 0.0  # the keeper
        if phase["earlier_jobs"] is None:
            return late if pod.index == 0 else 0.0
        if phase["lost"] is None and pod.job.name not in phase["earlier_jobs"]:
            phase["lost"] = pod.job.name
        return float("inf") if pod.job.name == phase["lost"] and pod.index > 0 else 0.0

    with Simulation(tmp_path / "sim", stack, SETTINGS, node_delay=node_delay) as sim:
        namespace = queue_namespace(gang_jobs)
        sim.submit(namespace, "late-leader", nodes=2)
        sim.settle(SETTLE_S)
        assert_each_run_once(sim, ["late-leader"])
        created = [e.job for e in sim.cluster.events
                   if e.kind == "job-created" and e.scaled_job == gang_jobs["metadata"]["name"]]
        assert len(created) == 1, created  # no gang timeout, no second Job
        stats = lambda: sim.queue(namespace).lane_stats()[Lane(nodes=2)]  # noqa: E731
        assert stats().gang_timeouts == 0

        phase["earlier_jobs"] = set(created)
        sim.submit(namespace, "lost-follower", nodes=2)
        sim.settle(SETTLE_S)
        finished = {e.job: e.detail for e in sim.cluster.events if e.kind == "job-finished"}
        first = phase["lost"]
        assert first is not None, "no Job was created for the second run"
        assert finished[first] == {"condition": "Failed", "reason": "PodFailurePolicy"}, finished
        assert stats().gang_timeouts == 1
        info = sim.info("lost-follower")
        assert info.state == "succeeded" and info.completions == 1 and info.attempts == 1, info
        assert sim.cluster.pod_named(sim.claimer_pods("lost-follower")[-1]).job.name != first
        assert sim.cluster.unfinished_jobs() == 0 and not sim.cluster.live_pods()


@pytest.mark.slow
@requires_redis
def test_a_team_lane_never_starts_more_gpu_workers_than_its_quota(plan, tmp_path):
    stack = stack_from_plan(plan, TEAM_NAMESPACE)
    assert stack.gpu_quotas[TEAM_NAMESPACE] == TEAM_QUOTA
    single = the_scaled_job(stack, nodes=1)
    assert single["spec"]["maxReplicaCount"] == TEAM_QUOTA  # 1 GPU per worker in dev
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        namespace = queue_namespace(single)
        run_ids = [sim.submit(namespace, f"team-{i}", max_steps=6).run_id for i in range(6)]
        run_ids.append(sim.submit(namespace, "team-gang", nodes=2, max_steps=4).run_id)
        sim.settle(SETTLE_S)
        assert_each_run_once(sim, run_ids)
        assert_within_bounds(sim)
        # The bound was reached (six runs queued for two workers), never passed.
        assert sim.cluster.max_unfinished[single["metadata"]["name"]] == TEAM_QUOTA
        assert sim.cluster.max_gpus[TEAM_NAMESPACE] <= TEAM_QUOTA


@pytest.mark.slow
@requires_redis
def test_a_ray_worker_that_finds_ray_unavailable_fails_its_job_and_the_run_waits_unspent(plan, tmp_path):
    """The Ray worker's run exits UNAVAILABLE (Ray cluster unreachable or token refused): the run is
    handed back unspent, the worker exits 4, and the Job's podFailurePolicy fails the Job (one pod,
    never retried inside it); KEDA starts a fresh Job while the run stays queued. Once Ray is back
    the next Job runs it, once, and the pool ends at zero."""
    full = stack_from_plan(plan, MAIN_NAMESPACE)
    ray = next(m for m in full.scaled_jobs if of_default_priority(m) and any(lane.executor == "ray" for lane in lanes_of(m)))
    stack = dataclasses.replace(full, scaled_jobs=[ray])
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        namespace = queue_namespace(ray)
        sim.exit_with("ray-down", exit_codes.UNAVAILABLE)
        sim.submit(namespace, "ray-down", executor="ray", max_steps=2)

        def failed_by_policy() -> list[str]:
            return [e.job for e in sim.cluster.events
                    if e.kind == "job-finished" and e.detail.get("reason") == "PodFailurePolicy"]
        sim.wait_for(lambda: len(failed_by_policy()) >= 2, 120, "two Ray worker Jobs failed by the podFailurePolicy")
        with sim.cluster.lock:
            failed = [j for j in sim.cluster.created if j.name in set(failed_by_policy())]
            assert all(len(j.pods) == 1 and j.pods[0].exit_code == exit_codes.UNAVAILABLE for j in failed), [
                [(p.name, p.exit_code) for p in j.pods] for j in failed]
        assert sim.info("ray-down").state in ("queued", "running"), sim.info("ray-down")
        sim.exit_with("ray-down", None)  # the Ray cluster is back
        sim.settle(SETTLE_S)
        info = sim.info("ray-down")
        assert info.state == "succeeded" and info.completions == 1 and info.attempts == 1, info
        assert sim.executions("ray-down") == 1
        assert sim.cluster.unfinished_jobs() == 0 and not sim.cluster.errors


def gang_timeouts(sim: Simulation, namespace: str) -> int:
    queue = sim.queue(namespace)
    stats = queue.client.hgetall(queue.key(Key.STATS))
    return sum(int(v) for k, v in stats.items() if k.startswith(GANG_TIMEOUTS_STAT))


@pytest.mark.slow
@requires_redis
def test_a_two_node_run_gets_both_pods_or_none(plan, tmp_path):
    """Only one GPU node can be had: pod 0 claims, pod 1 stays Pending; at the gang deadline the run
    is handed back (no attempt spent) without ever starting. With a second node, both pods run it."""
    full = stack_from_plan(plan, MAIN_NAMESPACE)
    two = the_scaled_job(full, nodes=2)
    pool = two["spec"]["jobTargetRef"]["template"]["spec"]["nodeSelector"]["ragpool.io/pool"]
    stack = dataclasses.replace(full, scaled_jobs=[two], gpu_capacity={pool: 1})
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        namespace = queue_namespace(two)
        sim.submit(namespace, "gang", nodes=2, max_steps=4)
        sim.wait_for(lambda: gang_timeouts(sim, namespace) >= 1, SETTINGS.gang_deadline_s + 60,
                     "the gang deadline to hand the run back")
        info = sim.info("gang")
        assert sim.run_log("gang") == [], "the run started with part of its gang"
        sim.wait_for(lambda: sim.info("gang").state == "queued", 30, "the run back in its lane")
        assert info.attempts <= 1
        # One node: never two pods at once. (Once pod 0 has left at the deadline, the node is free
        # and pod 1 may start there; it finds no gang and exits: the run stays unstarted.)
        running, most = set(), 0
        for event in sorted(sim.cluster.events, key=lambda e: e.at):
            if event.scaled_job != two["metadata"]["name"]:
                continue  # the keeper's pod (system nodes)
            if event.kind == "pod-started":
                running.add(event.detail["pod"])
            elif event.kind in ("pod-exited", "pod-lost"):
                running.discard(event.detail["pod"])
            most = max(most, len(running))
        assert most == 1, "two pods of the gang ran at once on one node"
        with sim.cluster.lock:
            sim.cluster.gpu_capacity[pool] = 2  # Karpenter gets the second node
        sim.settle(SETTLE_S)
        assert_each_run_once(sim, ["gang"])
        assert sim.info("gang").attempts == 1, "a gang timeout must not spend an attempt"
        attempts = {}
        for line in sim.run_log("gang"):
            words = line.split()
            attempts.setdefault(words[1], set()).add(words[3])
        assert attempts == {"1": {"0", "1"}}, sim.run_log("gang")
        assert sim.cluster.unfinished_jobs() == 0


SIGKILLED = 128 + 9


@pytest.mark.infra  # ``plan`` runs the Pulumi program
def test_the_job_controllers_replacement_rules_read_against_the_worker_templates(plan):
    """Issue 42: a lost node of a gang is replaced index by index and a bad one fails alone, by the Job controller's
    rules (bench/autoscale_sim_jobs.py ``failed_pod_outcome``, ``replaces_terminating``) read on the Jobs the plan
    declares."""
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    two = the_scaled_job(stack, nodes=2)["spec"]["jobTargetRef"]
    per_index = two["backoffLimitPerIndex"]
    assert 0 < per_index < two["backoffLimit"]
    # A spot notice: the pod checkpoints in its grace period before its index gets a new pod, and costs no retry.
    assert not replaces_terminating(two)
    notice = failed_pod_outcome(two, exit_codes.RETRIABLE, disrupted=True)
    assert (notice.action, notice.counted, notice.index_failed, notice.job_failed) == ("Ignore", False, False, None)
    assert notice.retry_after_s == POD_BACKOFF_S
    # Nodes lost again and again never fail the index; the replacement's back-off grows with them.
    again = failed_pod_outcome(two, SIGKILLED, disrupted=True, index_ignored=per_index + 2)
    assert not again.counted and not again.index_failed and again.job_failed is None
    assert again.retry_after_s > notice.retry_after_s
    # One node's worker crashing: counted on its index; past the limit that index fails, the other goes on ...
    crash = failed_pod_outcome(two, exit_codes.FAILED, index_failures=per_index - 1, job_failures=per_index - 1)
    assert crash.counted and not crash.index_failed and crash.retry_after_s == POD_BACKOFF_S * 2 ** (per_index - 1)
    out = failed_pod_outcome(two, exit_codes.FAILED, index_failures=per_index, job_failures=per_index)
    assert out.index_failed and out.job_failed is None and out.retry_after_s is None
    # ... and the Job fails once both have.
    both = failed_pod_outcome(two, exit_codes.FAILED, index_failures=per_index, job_failures=per_index, failed_indexes=1)
    assert both.index_failed and both.job_failed in ("MaxFailedIndexesExceeded", "BackoffLimitExceeded")
    # The Job-failing exits still fail the whole Job at once (no pod of it left Pending for KEDA to count).
    assert failed_pod_outcome(two, exit_codes.GANG_TIMEOUT).job_failed == "PodFailurePolicy"
    # A one-pod Job: its only index failing fails the Job.
    one = the_scaled_job(stack, nodes=1)["spec"]["jobTargetRef"]
    assert failed_pod_outcome(one, exit_codes.FAILED, index_failures=per_index).job_failed == "MaxFailedIndexesExceeded"
    # Without a per-index limit (no such field): the Job's own back-off, none after a disruption.
    legacy = {k: v for k, v in two.items() if k not in ("backoffLimitPerIndex", "maxFailedIndexes")}
    assert failed_pod_outcome(legacy, SIGKILLED, disrupted=True).retry_after_s == 0.0
    assert failed_pod_outcome(legacy, exit_codes.FAILED, job_failures=2).retry_after_s == POD_BACKOFF_S * 4
    assert replaces_terminating({}) and not replaces_terminating({"podReplacementPolicy": "Failed"})


@pytest.mark.slow
@requires_redis
def test_a_drained_workers_index_gets_its_next_pod_only_once_the_pod_is_gone(plan, tmp_path):
    """Issue 42: a spot notice drains a worker's node. Its pod gets SIGTERM and a DisruptionTarget condition and
    checkpoints in its grace period; its Job creates the index's next pod only once the pod has exited
    (``podReplacementPolicy: Failed``), after the index's back-off, and the run resumes from that checkpoint."""
    stack = stack_from_plan(plan, MAIN_NAMESPACE)
    with Simulation(tmp_path / "sim", stack, SETTINGS) as sim:
        sim.submit(queue_namespace(the_scaled_job(stack, nodes=1)), "drained", max_steps=30)
        sim.wait_for(lambda: sim.checkpoint("drained") >= 2, 120, "the run to checkpoint step 2")
        pod = sim.cluster.pod_named(sim.claimer_pods("drained")[0])
        sim.cluster.drain_node_of(pod)
        sim.wait_for(lambda: pod.phase != "Running", 60, "the drained pod to exit")
        sim.settle(SETTLE_S)
        info = sim.info("drained")
        assert info.state == "succeeded" and info.completions == 1, info
        assert pod.exit_code == exit_codes.RETRIABLE and pod.disrupted, pod
        successors = [p for p in pod.job.pods if p.index == pod.index and p is not pod]
        assert successors and min(p.created_at for p in successors) >= pod.ended_at + POD_BACKOFF_S - 1, (
            [(p.name, p.created_at) for p in successors], pod.ended_at)
        assert pod.job.failures == 0 and pod.job.index_failures[pod.index] == (0, 1)
        assert sim.executions("drained") == 1
        # Handed back preempted (exit 75 after the checkpoint): no attempt spent, resumed by another pod from it.
        assert info.attempts == 1, info
        assert len(sim.claimer_pods("drained")) == 2 and sim.claimer_pods("drained")[0] == pod.name
        assert int(sim.run_log("drained")[1].rsplit(" ", 1)[1]) >= 2, sim.run_log("drained")


@pytest.mark.slow
@requires_redis
def test_a_high_run_preempts_a_normal_one_in_its_clusterqueue_and_nothing_is_lost_or_run_twice(plan, tmp_path):
    """Issue 41, end to end: with a ScaledJob per (kind, priority) a high run's Job carries the high
    WorkloadPriorityClass, so Kueue (bench/kueue_gate.py over the plan's objects) preempts the newest normal Job of the
    team's full ClusterQueue for it; that worker hands its run back unspent, the Job is suspended and readmitted
    once the high one finished, and its run resumes from its checkpoint. Each run succeeds once, each on a Job of
    its own priority (a normal worker never claims the high run)."""
    stack = stack_from_plan(plan, TEAM_NAMESPACE)
    single = {container_env(m, PRIORITIES_ENV): m["metadata"]["name"] for m in stack.scaled_jobs
              if all(lane.executor == "torchrun" and lane.nodes == 1 for lane in lanes_of(m))}
    assert set(single) == {"high", "normal", "low"}, single
    with Simulation(tmp_path / "sim", stack, SETTINGS, kueue=True) as sim:
        namespace = queue_namespace(stack.scaled_jobs[0])
        normal = [sim.submit(namespace, f"normal-{i}", max_steps=24).run_id for i in range(TEAM_QUOTA)]
        sim.wait_for(lambda: all(sim.checkpoint(r) >= 1 for r in normal), 60, "both normal runs to take a step")
        high = sim.submit(namespace, "high", priority="high", max_steps=2).run_id
        sim.settle(SETTLE_S)
        assert_each_run_once(sim, [*normal, high])
        [eviction] = sim.cluster.kueue.evictions
        assert eviction.reason == "InClusterQueue" and eviction.by.startswith(single["high"] + "-"), eviction
        [preempted] = [r for r in normal if len(sim.claimer_pods(r)) == 2]
        assert sim.info(preempted).attempts == 1, "a preempted run spends no attempt"
        resumed_from = int(sim.run_log(preempted)[1].rsplit(" ", 1)[1])
        assert resumed_from >= 1, sim.run_log(preempted)  # from its checkpoint, not from step 0
        assert sim.cluster.max_gpus[TEAM_NAMESPACE] <= TEAM_QUOTA
        for run_id in [*normal, high]:  # each run's pods are Jobs of its priority's ScaledJob
            scaled = {sim.cluster.pod_named(pod).job.scaled_job.name for pod in sim.claimer_pods(run_id)}
            assert scaled == {single[sim.info(run_id).priority]}, (run_id, scaled)
        assert sim.cluster.kueue.workloads[eviction.by].priority > sim.cluster.kueue.workloads[eviction.job].priority
