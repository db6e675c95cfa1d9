"""The pool from zero, measured: KEDA's ScaledJob loop starts workers for queued runs, they exit
when idle, a lost worker's run is picked up again.

    python -m bench.autoscale [--polling-interval-s 2] [--idle-exit-s 3] [--lease-s 4] [--runs 20]
                              [--out .local/bench-autoscale] [--no-ray] [--smoke]

Runs the from-zero simulation (bench/autoscale_sim.py: the dev stack's ScaledJobs from the
offline plan, KEDA v2.20.2's job-count algorithm, a fake Job controller whose pods are real
``python -m training.worker`` processes, a real redis-server and the real keeper):

1. Burst: from 0 Jobs, ``--runs`` runs at once (high / normal / low priority; unpinned and
   pinned single-pod torchrun runs, ray runs when the stack has Ray, one 2-node run), until
   every run succeeded and every Job finished (back to 0).
2. Lost node: one longer run; when it has checkpointed, its worker and everything under it
   get SIGKILL. The run must be claimed again (the keeper requeues the lapsed lease; a
   replacement pod or a new Job takes it) and resume from its checkpoint.
3. ``ray_from_zero_s``: ``bench.ray_from_zero.measure`` (an idle Ray AutoscalingCluster to the
   first stage running), unless ``--no-ray`` or ``--smoke``.

Prints one JSON line last: the settings (``polling_interval_s``, ``idle_exit_s``, ``lease_s``) and

- ``submit_to_job_p95_s``: submit -> creation of the run's Job, p95 over the burst runs whose
  lane had room (its ScaledJob below ``maxReplicaCount``); goal <= interval + 2 s. A ScaledJob's
  Job is one run, and KEDA starts Jobs for a count of queued runs, so the k-th run submitted to a
  ScaledJob's lanes is matched with the k-th Job it created (``Simulation.job_delays``); a run
  never counts as 0 s because some worker took it;
- ``capacity_wait_p95_s`` (``runs_that_waited_for_capacity``): the same for the runs that waited
  because their lane was at ``maxReplicaCount`` (a poll between submit and their Job left it
  there): a bound doing its job, reported, no goal;
- ``idle_worker_s_per_run``: worker-seconds (pod start to exit, every pod) not holding a run,
  per run, over the burst; goal <= idle-exit + interval;
- ``surplus_jobs``: Jobs of the burst none of whose pods ran anything; goal 0
  (``surplus_jobs_that_waited_for_a_node``: those whose pod waited for GPU capacity first);
- ``replacement_s``: SIGKILL -> the run claimed again; goal <= lease + interval + 5 s;
- ``lost_runs``, ``double_runs``: runs not succeeded / done more than once (either phase); goal 0;
- ``ray_from_zero_s`` (null when not measured; ``ray_from_zero_note`` says why);
- ``goals``: each goal true/false. Exit 0 when all hold, 1 otherwise, 2 on bad arguments.

A burst run takes ``--run-steps`` (+0..2) workload steps of 0.25 s. A ScaledJob's worker takes
one run and exits (infra/keda.py ``one_run_per_job``), so no worker takes a run another Job was
started for, however short the runs (docs/DESIGN.md, "One Job, one run").

``--smoke``: 8 runs of 4 steps, no Ray, for tests/bench/test_autoscale.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

from bench.report import finish

REPLACEMENT_SLACK_S = 5.0
"""``replacement_s`` goal: lease + polling interval + this."""
SUBMIT_SLACK_S = 2.0
"""``submit_to_job_p95_s`` goal: polling interval + this."""
PHASE_TIMEOUT_S = 300.0
"""Bound of each wait of a phase."""


def burst_runs(sim, manifests: list, n: int, steps: int = 4) -> list[str]:
    """Submit ``n`` mixed runs of ``steps`` to ``steps + 2`` workload steps: priorities in turn, one 2-node run when a ScaledJob takes 2-node
    runs, ray runs when one takes those, runs pinned to the default pool's name, the rest unpinned."""
    from bench.autoscale_sim_plan import lanes_of, queue_namespace
    from contract.lanes import PRIORITIES

    lanes = {lane for m in manifests for lane in lanes_of(m)}
    namespace = queue_namespace(manifests[0])
    kinds: list[dict] = []
    if any(lane.nodes == 2 and lane.pool is None for lane in lanes):
        kinds.append({"nodes": 2})
    if any(lane.executor == "ray" for lane in lanes):
        kinds += [{"executor": "ray"}] * max(1, n // 8)
    pinned = sorted(lane.pool for lane in lanes if lane.pool and lane.nodes == 1)
    if pinned:
        kinds += [{"pool": pinned[0]}] * max(1, n // 4)
    kinds += [{}] * max(0, n - len(kinds))
    run_ids = []
    for i, fields in enumerate(kinds[:n]):
        run_id = f"burst-{i:02d}"
        sim.submit(namespace, run_id, priority=PRIORITIES[i % len(PRIORITIES)], max_steps=steps + i % 3,
                   **fields)
        run_ids.append(run_id)
    return run_ids


def lose_a_node(sim, manifests: list, *, max_steps: int = 40, at_step: int = 3) -> dict:
    """Phase 2: a longer run, its holder lost at ``at_step``; the figures of its replacement."""
    from bench.autoscale_sim_plan import queue_namespace

    namespace = queue_namespace(manifests[0])
    sim.submit(namespace, "lost-node", max_steps=max_steps)
    sim.wait_for(lambda: sim.checkpoint("lost-node") >= at_step, PHASE_TIMEOUT_S, f"lost-node to checkpoint step {at_step}")
    pod = sim.cluster.pod_named(sim.claimer_pods("lost-node")[0])
    checkpoint = sim.checkpoint("lost-node")
    killed_at = sim.cluster.lose_node_of(pod)
    info = sim.wait_for(lambda: (i := sim.info("lost-node")) and i.attempts >= 2 and i.claimed_at and i, PHASE_TIMEOUT_S,
                        "lost-node to be claimed again")
    sim.settle(PHASE_TIMEOUT_S)
    resumed = [line for line in sim.run_log("lost-node") if line.startswith("attempt 2 ")]
    return {"replacement_s": round(info.claimed_at - killed_at, 2), "checkpoint_at_kill": checkpoint,
            "resumed_from_step": int(resumed[0].rsplit(" ", 1)[1]) if resumed else None,
            "replaced_by": "the lost pod's Job (a new pod)" if sim.claimer_pods("lost-node")[-1].startswith(pod.job.name)
            else "a new Job"}


def ray_from_zero(out: Path, skip: str | None) -> tuple[float | None, str]:
    if skip:
        return None, skip
    if importlib.util.find_spec("bench.ray_from_zero") is None:
        return None, "bench/ray_from_zero.py is not there"
    from bench.ray_from_zero import measure

    return round(measure(out / "ray"), 2), "bench.ray_from_zero.measure"


def measure(args: argparse.Namespace) -> dict:
    from bench.autoscale_sim import Simulation
    from bench.autoscale_sim_plan import Settings, stack_from_plan
    from infra.plan import plan
    from infra.peers import TRAINING_NAMESPACE

    out = Path(args.out).resolve()
    settings = Settings(polling_interval_s=args.polling_interval_s, idle_exit_s=args.idle_exit_s, lease_s=args.lease_s)
    stack = stack_from_plan(plan("dev"), TRAINING_NAMESPACE)
    manifests = stack.scaled_jobs
    load_start = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    with Simulation(out / "sim", stack, settings) as sim:
        run_ids = burst_runs(sim, manifests, args.runs, args.run_steps)
        sim.settle(PHASE_TIMEOUT_S)
        burst = sim.figures(run_ids)
        bounds = {sj.name: (sj.spec.get("maxReplicaCount"), sim.cluster.max_unfinished[sj.name])
                  for sj in sim.cluster.scaled_jobs}
        lost = lose_a_node(sim, manifests)
        everything = sim.figures()
    ray_s, ray_note = ray_from_zero(out, "skipped (--smoke)" if args.smoke else "skipped (--no-ray)" if args.no_ray else None)
    result = {
        "polling_interval_s": args.polling_interval_s, "idle_exit_s": args.idle_exit_s, "lease_s": args.lease_s,
        "runs": len(run_ids) + 1,
        "run_steps": args.run_steps, "step_s": settings.step_s,
        "submit_to_job_p95_s": burst["submit_to_job_p95_s"],
        "capacity_wait_p95_s": burst["capacity_wait_p95_s"],
        "runs_that_waited_for_capacity": burst["runs_that_waited_for_capacity"],
        "idle_worker_s_per_run": burst["idle_worker_s_per_run"],
        "surplus_jobs": burst["surplus_jobs"],
        "surplus_jobs_that_waited_for_a_node": burst["surplus_jobs_that_waited_for_a_node"],
        "jobs_created": burst["jobs_created"],
        "max_jobs_vs_max_replica_count": {name: {"max_replica_count": hi, "max_unfinished_jobs": seen}
                                          for name, (hi, seen) in bounds.items()},
        **lost,
        "lost_runs": everything["lost_runs"],
        "double_runs": everything["double_runs"],
        "ray_from_zero_s": ray_s, "ray_from_zero_note": ray_note,
        "sim_wall_s": round(time.monotonic() - started, 1),
        "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
        "cpu_cores": os.cpu_count(),
    }
    interval = args.polling_interval_s
    result["goals"] = {
        "submit_to_job_p95_within_interval_plus_2s": (burst["submit_to_job_p95_s"] or 0) <= interval + SUBMIT_SLACK_S,
        "idle_worker_s_per_run_within_idle_exit_plus_interval":
            burst["idle_worker_s_per_run"] <= args.idle_exit_s + interval,
        "no_surplus_jobs": burst["surplus_jobs"] == 0,
        "replacement_within_lease_plus_interval_plus_5s": lost["replacement_s"] <= args.lease_s + interval + REPLACEMENT_SLACK_S,
        "no_lost_runs": everything["lost_runs"] == 0,
        "no_double_runs": everything["double_runs"] == 0,
        "jobs_within_max_replica_count": all(hi is None or seen <= hi for hi, seen in bounds.values()),
    }
    return result


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__.split("\n\n")[0])
    p.add_argument("--polling-interval-s", type=int, default=2,
                   help="the ScaledJobs' pollingInterval, whole seconds as in the CRD (default 2; KEDA's default is 30)")
    p.add_argument("--idle-exit-s", type=float, default=3.0, help="the workers' --idle-exit-seconds (default 3)")
    p.add_argument("--lease-s", type=float, default=4.0, help="the workers' --lease-seconds (default 4)")
    p.add_argument("--runs", type=int, default=20, help="runs in the burst (default 20)")
    p.add_argument("--run-steps", type=int, default=16,
                   help="workload steps of a burst run (0.25 s each, +0..2; default 16: a run outlasts a worker's "
                        "start, as a training run does)")
    p.add_argument("--out", default=".local/bench-autoscale", help="work directory (default .local/bench-autoscale)")
    p.add_argument("--no-ray", action="store_true", help="do not measure ray_from_zero_s")
    p.add_argument("--smoke", action="store_true", help="8 runs, no Ray: for tests")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.smoke:
        args.runs, args.run_steps = min(args.runs, 8), min(args.run_steps, 4)
    problems = []
    if args.polling_interval_s < 1:
        problems.append("--polling-interval-s must be a whole number of seconds >= 1")
    if args.idle_exit_s <= 0 or args.lease_s <= 0:
        problems.append("--idle-exit-s and --lease-s must be > 0")
    if args.runs < 3:
        problems.append("--runs must be at least 3 (a mix of lanes and priorities)")
    if args.run_steps < 1:
        problems.append("--run-steps must be at least 1")
    return finish("bench.autoscale", problems, lambda: measure(args))


if __name__ == "__main__":
    sys.exit(main())
