"""Teams sharing the pool through Kueue, measured: an idle team's GPUs are borrowed, and reclaimed
when it submits; preempted runs checkpoint and resume.

    python -m bench.fair_share [--team-gpus 2] [--pool-gpus 8] [--burst 6] [--steps 24] [--polling-interval-s 2]
                               [--out .local/bench-fair-share] [--no-baseline] [--fair-sharing] [--smoke]

The dev stack's plan with three teams (``a``, ``b``, ``c``, ``--team-gpus`` GPUs each; the main
namespace's ClusterQueue holds the rest of the pool's ``gpuLimit``, ``--pool-gpus`` when given), run by the from-zero simulation
(bench/autoscale_sim.py: KEDA v2.20.2's job-count algorithm, a fake Job controller whose pods are real
``python -m training.worker`` processes on a real redis-server) with Kueue in front of the Job
controller (bench/kueue_gate.py: Jobs created suspended, admitted or evicted by Kueue v0.19.2's
transcribed scheduler, bench/kueue/scheduler.py, over the plan's own ClusterQueues, Cohort and
LocalQueues; the ScaledJobs' ``maxReplicaCount`` and the namespaces' ResourceQuotas as the plan sets them:
what a team can reach by borrowing).

Scenario: team ``b`` submits a burst of ``--burst`` single-GPU runs and one 2-node run of ``--steps``
workload steps (0.25 s each, a checkpoint after each) while ``a`` and ``c`` are idle, so ``b`` borrows;
once every run of ``b`` runs and ``b`` holds more than its nominal quota, ``a`` submits two runs and
``c`` one (of ``--steps`` / 4): Kueue reclaims the lent GPUs (``reclaimWithinCohort: Any``), the evicted
workers get SIGTERM and hand their runs back (no attempt spent), which resume from their checkpoints when
admitted again. Then the same runs under hard quotas, as before Kueue (no Kueue; each team's ResourceQuota
and ``maxReplicaCount`` at its nominal quota), for the makespan comparison, unless ``--no-baseline``.

Prints one JSON line last:

- ``idle_gpu_share``: over the samples (every 0.25 s) in which some Workload waits in Kueue (a Job
  created, not admitted), the mean share of the pool's GPUs that Kueue has not reserved; goal <= 0.05
  (idle quota while a team waits: what admission, borrowing and reclaim decide);
- ``idle_gpu_share_runs``: over the samples in which some submitted run waits unclaimed, the mean share
  of the pool's GPUs not running a claimed run (also KEDA's polling, pod and worker start, the SIGTERM
  hand-back: with runs of seconds this dominates; no goal);
- ``reclaim_s``: team ``a``'s first submit -> its first run claimed; goal <= the workers' graceful
  checkpoint time (the pod's grace, capped: ``Settings.stop_grace_s``) + the polling interval + 10 s;
- ``preempted_lost_steps``: over the evictions, checkpoint at eviction minus the step the run resumed
  from (> 0: steps done twice); goal <= 1 (the checkpoint interval, one step);
- ``evictions``, ``preempted_runs``; ``lost_runs`` and ``double_runs`` (goal 0);
- ``max_gpus_vs_reachable``: per team namespace, the most GPUs its pods held at once against what its
  ClusterQueue can reach (goal: never above), its nominal quota, and the GPUs its largest ScaledJob's
  ``maxReplicaCount`` can ask for (goal: at least the reachable GPUs, or borrowing is never asked for);
- ``makespan_s`` (first submit -> last run done) and ``makespan_hard_quotas_s`` (the same burst under
  hard quotas; null with ``--no-baseline``);
- ``goals``: each goal true/false. Exit 0 when all hold, 1 otherwise, 2 on bad arguments.

``--smoke``: teams of 1 GPU in a pool of 4, a burst of 2 runs (and the 2-node one) of 20 steps (b's
runs outlast a KEDA poll after the last of them started, so a's and c's Jobs find the pool full), no
baseline: for tests/bench/test_fair_share.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import finish

TEAMS = ("a", "b", "c")
RECLAIM_SLACK_S = 10.0
"""``reclaim_s`` goal: graceful checkpoint time + polling interval + this."""
IDLE_GOAL = 0.05
LOST_STEPS_GOAL = 1
"""The checkpoint interval of the simulated workload: one step."""
SAMPLE_S = 0.25
PHASE_TIMEOUT_S = 300.0


def team_namespace(team: str) -> str:
    from contract.names import TEAM_NAMESPACE_PREFIX

    return f"{TEAM_NAMESPACE_PREFIX}{team}"


def stack_overrides(team_gpus: int, pool_gpus: int | None) -> dict[str, Any]:
    """The plan's config overrides: the three teams, and the dev stack's GPU pools with ``gpuLimit``
    ``pool_gpus`` (when given)."""
    out: dict[str, Any] = {"trainingTeams": [{"name": t, "gpuQuota": team_gpus} for t in TEAMS]}
    if pool_gpus is not None:
        from infra.stack import REPO_ROOT, read_yaml_file

        declared = {}
        for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
            config = (read_yaml_file(REPO_ROOT / name) or {}).get("config") or {}
            for key in ("gpuPools", "ragpool:gpuPools"):
                value = config.get(key)
                if isinstance(value, dict):
                    value = value.get("default")
                if value is not None:
                    declared = value
        out["gpuPools"] = [{**pool, "gpuLimit": pool_gpus} for pool in declared]
    return out


def with_max_replicas(stack, max_replicas) -> Any:
    """``stack`` whose ScaledJobs' ``maxReplicaCount`` is ``max_replicas(manifest)``."""
    import copy

    manifests = []
    for m in stack.scaled_jobs:
        m = copy.deepcopy(m)
        m["spec"]["maxReplicaCount"] = max_replicas(m)
        manifests.append(m)
    return dataclasses.replace(stack, scaled_jobs=manifests)


def job_gpus(manifest: dict) -> tuple[str | None, int]:
    """(pool, GPUs) of one Job of a ScaledJob: ``parallelism`` pods × the container's GPU request."""
    from contract.names import GPU_RESOURCE, POOL_LABEL

    job = manifest["spec"]["jobTargetRef"]
    pod = job["template"]["spec"]
    gpus = int(pod["containers"][0].get("resources", {}).get("requests", {}).get(GPU_RESOURCE, 0))
    return (pod.get("nodeSelector") or {}).get(POOL_LABEL), gpus * int(job.get("parallelism", 1))


def lane_namespace(stack, team: str, nodes: int) -> str:
    """The queue namespace of the team's GPU torchrun ScaledJob for ``nodes``-node runs."""
    from bench.autoscale_sim_plan import lanes_of, queue_namespace

    ns = team_namespace(team)
    for m in stack.scaled_jobs:
        if m["metadata"]["namespace"] == ns and all(
                lane.executor == "torchrun" and lane.nodes == nodes for lane in lanes_of(m)):
            return queue_namespace(m)
    raise ValueError(f"the plan has no {nodes}-node torchrun ScaledJob in {ns}")


class Sampler:
    """Every ``SAMPLE_S``: whether some Workload waits in Kueue and the GPUs Kueue has reserved; whether
    some submitted run waits unclaimed and the GPUs running claimed runs."""

    def __init__(self, sim, capacity: int) -> None:
        self.sim, self.capacity = sim, capacity
        self.samples: list[tuple[float, bool, int]] = []
        self.kueue_samples: list[tuple[bool, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fair-share-sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            waiting, busy = False, 0
            for run_id, sub in list(self.sim.submitted.items()):
                info = self.sim.info(run_id)
                if info is None:
                    continue
                if info.state == "queued":
                    waiting = True
                elif info.state == "running":
                    busy += sub.nodes
            self.samples.append((time.time(), waiting, busy))
            gate = self.sim.cluster.kueue
            if gate is not None:
                from contract.names import GPU_RESOURCE

                with self.sim.cluster.lock:
                    pending = any(gate.scheduler.pending.values())
                    reserved = sum(cq.usage.get((POOL, GPU_RESOURCE), 0) for cq in gate.cluster.cqs.values())
                self.kueue_samples.append((pending, reserved))

    def _share(self, samples) -> float | None:
        busy = [b for waiting, b in samples if waiting]
        if not busy:
            return None
        return round(sum(max(0, self.capacity - b) for b in busy) / (len(busy) * self.capacity), 3)

    def idle_share(self) -> float | None:
        """Pool GPUs Kueue has not reserved, while some Workload waits for admission."""
        return self._share(self.kueue_samples)

    def idle_share_runs(self) -> float | None:
        """Pool GPUs not running a claimed run, while some run waits unclaimed."""
        return self._share([(w, b) for _, w, b in self.samples])


def scenario(sim, stack, *, burst: int, steps: int, a_count: int = 2, gate=None) -> dict:
    """Team b's burst; with Kueue, teams a and c submit once b borrows. Returns the run ids and times."""
    b1, b2 = lane_namespace(stack, "b", 1), lane_namespace(stack, "b", 2)
    runs = [sim.submit(b1, f"b-{i:02d}", max_steps=steps).run_id for i in range(burst)]
    runs.append(sim.submit(b2, "b-gang", nodes=2, max_steps=steps).run_id)
    started = sim.submitted[runs[0]].submitted_at
    reclaim_from = None
    if gate is not None:
        nominal = gate.nominal_gpus(team_namespace("b"), POOL)
        sim.wait_for(lambda: sim.cluster.max_gpus.get(team_namespace("b"), 0) > nominal
                     and all(sim.info(r).state == "running" for r in runs), PHASE_TIMEOUT_S,
                     f"every run of team b to run, beyond its nominal {nominal} GPUs")
    else:
        sim.wait_for(lambda: any(sim.info(r).state == "running" for r in runs), PHASE_TIMEOUT_S,
                     "team b's first run to start")
    a1, c1 = lane_namespace(stack, "a", 1), lane_namespace(stack, "c", 1)
    short = max(2, steps // 4)
    a_runs = [sim.submit(a1, f"a-{i}", max_steps=short).run_id for i in range(a_count)]
    reclaim_from = sim.submitted[a_runs[0]].submitted_at
    runs += a_runs + [sim.submit(c1, "c-0", max_steps=short).run_id]
    sim.settle(PHASE_TIMEOUT_S)
    done = max(sim.info(r).finished_at for r in runs)
    first_a = min(sim.info(r).claimed_at for r in a_runs if sim.info(r).claimed_at)
    return {"runs": runs, "makespan_s": round(done - started, 2),
            "reclaim_s": round(first_a - reclaim_from, 2) if reclaim_from else None}


def lost_steps_of(log: list[str], eviction: dict) -> int:
    """Steps an eviction cost: its checkpoint then, minus the step the next execution on the same
    node resumed from (``sim-log`` lines ``attempt N node I worker W from step S``, in order)."""
    prefix = f" node {eviction['node']} worker "
    lines = [line for line in log if prefix in line]
    held = [i for i, line in enumerate(lines) if f"{prefix}{eviction['pod']} " in line]
    if not held or held[-1] + 1 >= len(lines):
        return 0
    resumed = int(lines[held[-1] + 1].rsplit(" ", 1)[1])
    return max(0, eviction["checkpoint"] - resumed)


POOL = "gpu-spot"
"""The dev stack's GPU pool (its NodePool's ``ragpool.io/pool`` and the ResourceFlavor's name)."""


def measure(args: argparse.Namespace) -> dict:
    from bench.autoscale_sim import Simulation
    from bench.autoscale_sim_plan import Settings, stack_from_plan
    from bench.kueue_gate import KueueGate
    from infra.plan import plan

    out = Path(args.out).resolve()
    settings = Settings(polling_interval_s=args.polling_interval_s)
    the_plan = plan("dev", overrides=stack_overrides(args.team_gpus, args.pool_gpus))
    base = stack_from_plan(the_plan)
    if POOL not in base.gpu_capacity:
        raise ValueError(f"the dev plan has no NodePool for pool {POOL!r}: {sorted(base.gpu_capacity)}")
    capacity = base.gpu_capacity[POOL]
    probe = KueueGate(base.kueue_objects)

    def nominal_jobs(m: dict) -> int:
        pool, gpus = job_gpus(m)
        if not gpus:
            return m["spec"].get("maxReplicaCount", 1)
        return max(1, probe.nominal_gpus(m["metadata"]["namespace"], pool) // gpus)

    stack = base
    hard = dataclasses.replace(with_max_replicas(base, nominal_jobs), kueue_objects=[], gpu_quotas={
        ns: probe.nominal_gpus(ns, POOL) for ns in base.gpu_quotas})
    evictions: list[dict] = []
    sim_box: dict[str, Any] = {}

    def on_evict(ev) -> None:
        """Which runs the evicted pods held, and their checkpoints now."""
        sim = sim_box["sim"]
        for pod_name in ev.pods:
            pod = sim.cluster.pod_named(pod_name)
            for run_id in sim.submitted:
                info = sim.info(run_id)
                if info is not None and info.state == "running" and info.worker == pod_name:
                    evictions.append({"run": run_id, "pod": pod_name, "node": pod.index, "at": ev.at,
                                      "checkpoint": sim.checkpoint(run_id, pod.index), "reason": ev.reason})

    with Simulation(out / "kueue", stack, settings, kueue=True, fair_sharing=args.fair_sharing,
                    on_evict=on_evict) as sim:
        sim_box["sim"] = sim
        with Sampler(sim, capacity) as sampler:
            got = scenario(sim, stack, burst=args.burst, steps=args.steps, gate=sim.cluster.kueue)
        figures = sim.figures(got["runs"])
        gate = sim.cluster.kueue
        bounds = {ns: {"max_gpus": sim.cluster.max_gpus.get(ns, 0), "reachable": gate.gpus_reachable(ns, POOL),
                       "nominal": gate.nominal_gpus(ns, POOL),
                       "max_replica_count_gpus": max(m["spec"]["maxReplicaCount"] * job_gpus(m)[1]
                                                     for m in stack.scaled_jobs if m["metadata"]["namespace"] == ns)}
                  for ns in map(team_namespace, TEAMS)}
        lost_steps = sum(lost_steps_of(sim.run_log(ev["run"]), ev) for ev in evictions)
        idle, idle_runs = sampler.idle_share(), sampler.idle_share_runs()
    baseline = None
    if not args.no_baseline:
        with Simulation(out / "hard", hard, settings) as sim:
            baseline = scenario(sim, hard, burst=args.burst, steps=args.steps)["makespan_s"]
    interval = args.polling_interval_s
    result = {
        "teams": list(TEAMS), "team_gpus": args.team_gpus, "pool_gpus": capacity, "burst": args.burst,
        "steps": args.steps, "step_s": settings.step_s, "polling_interval_s": interval,
        "fair_sharing": args.fair_sharing,
        "idle_gpu_share": idle, "idle_gpu_share_runs": idle_runs,
        "reclaim_s": got["reclaim_s"],
        "evictions": len(gate.evictions),
        "preempted_runs": len({e["run"] for e in evictions}),
        "preempted_lost_steps": lost_steps,
        "lost_runs": figures["lost_runs"], "double_runs": figures["double_runs"],
        "max_gpus_vs_reachable": bounds,
        "makespan_s": got["makespan_s"], "makespan_hard_quotas_s": baseline,
    }
    result["goals"] = {
        "idle_gpu_share_at_most_0_05": idle is not None and idle <= IDLE_GOAL,
        "reclaim_within_grace_plus_interval_plus_10s":
            got["reclaim_s"] is not None and got["reclaim_s"] <= settings.stop_grace_s + interval + RECLAIM_SLACK_S,
        "preempted_lost_steps_within_checkpoint_interval": lost_steps <= LOST_STEPS_GOAL,
        "some_run_was_preempted": bool(evictions),
        "no_lost_runs": figures["lost_runs"] == 0,
        "no_double_runs": figures["double_runs"] == 0,
        "no_team_above_reachable": all(b["max_gpus"] <= b["reachable"] for b in bounds.values()),
        "max_replica_count_reaches_what_a_team_can_borrow":
            all(b["max_replica_count_gpus"] >= b["reachable"] for b in bounds.values()),
    }
    return result


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fair_share", description=__doc__.split("\n\n")[0])
    p.add_argument("--team-gpus", type=int, default=2, help="each team's gpuQuota (default 2)")
    p.add_argument("--pool-gpus", type=int, default=None, help="the GPU pool's gpuLimit (default: the dev stack's)")
    p.add_argument("--burst", type=int, default=6, help="team b's single-GPU runs (default 6), plus one 2-node run")
    p.add_argument("--steps", type=int, default=24, help="workload steps of b's runs, 0.25 s each (default 24)")
    p.add_argument("--polling-interval-s", type=int, default=2, help="the ScaledJobs' pollingInterval (default 2)")
    p.add_argument("--out", default=".local/bench-fair-share", help="work directory (default .local/bench-fair-share)")
    p.add_argument("--no-baseline", action="store_true", help="skip the hard-quota run (no makespan_hard_quotas_s)")
    p.add_argument("--fair-sharing", action="store_true", help="Kueue's fair sharing on (the manager's fairSharing)")
    p.add_argument("--smoke", action="store_true", help="a burst of 2 runs of 20 steps in a pool of 4, no baseline: "
                                                         "for tests")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.smoke:
        args.burst, args.steps, args.no_baseline = min(args.burst, 2), min(args.steps, 20), True
        args.team_gpus, args.pool_gpus = 1, 4
    problems = []
    if args.team_gpus < 1:
        problems.append("--team-gpus must be at least 1")
    if args.pool_gpus is not None and args.pool_gpus < 3 * args.team_gpus:
        problems.append("--pool-gpus must hold the three teams' --team-gpus")
    if args.burst < 1 or args.steps < 2:
        problems.append("--burst must be at least 1 and --steps at least 2")
    if args.polling_interval_s < 1:
        problems.append("--polling-interval-s must be a whole number of seconds >= 1")
    return finish("bench.fair_share", problems, lambda: measure(args))


if __name__ == "__main__":
    sys.exit(main())
