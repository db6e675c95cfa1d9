"""The elastic Ray Train scenario of tests/training/ray/test_elastic.py, run in a process of its own (the test's
xdist worker never becomes a Ray driver: tests/conftest.py ``RAY_DRIVER_MODULES``):

    python -m tests.support.ray_elastic CONFIG PACE_DIR TEMP_DIR

A local Ray of simulated nodes (``ray.cluster_utils.Cluster``: a 0-CPU head, three 1-CPU nodes), the run's
stages submitted with the pacing hook on (tests/support/pacing.py, the hold file already in PACE_DIR). After a
step at 3 workers a node holding a rank gets a spot notice: the Ray worker pod's preStop hook
(``python -m training.ray.notice``, here with the node's id and the cluster's address) drains it as preempted and
waits for the ranks' checkpoint; the hold is lifted for the ranks to see the notice at their next step, and once
the hook returns the node is removed (its pod's SIGTERM). After a step at 2 a node is added, after a step at 3
again the hold is lifted and the run finishes. Prints one JSON line last: the seconds each phase took and what the
preStop hook said. Any failure exits non-zero with its message; the cluster is stopped in every case (SIGTERM too).

Ray Train v2's elastic policy sizes a worker group from what Ray's ``AutoscalingCoordinator`` actor reserves for
it, and that actor re-reads the cluster's nodes every ``TICK_INTERVAL_S`` (20 s in Ray 2.58,
ray/data/_internal/cluster_autoscaler/default_autoscaling_coordinator.py): here the cluster's coordinator (a named,
detached actor Ray Train reuses) is started from :class:`FastTickCoordinator`, so a lost or added node is seen
within a second; Ray Train's preemption watcher polls drains every 0.5 s instead of 5 (its own variable).
Nothing else differs from Ray's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as coordinator

from tests.support import pacing

STEP_S = 300.0
"""Bound on each wait for a step at a new size: a worker-group restart takes ~20-25 s on a loaded 2-core machine,
but after the notice the first start at 3 waits out ``ray.elastic_start_timeout_s`` once or twice (the drained node
counts until Ray sees it gone), and on a slow day the suite's load makes all of it 2-3x longer (150 s was too
short once, in a 30-minute suite)."""
PREEMPTION_POLL_ENV = "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"
"""How often Ray Train's preemption watcher polls the drained nodes (5 s by default)."""
NOTICE_DEADLINE_S = 60
"""The drain's deadline (a pod's grace period): the longest the ranks wait for the drained node to go."""


class FastTickCoordinator(coordinator._AutoscalingCoordinatorActor):
    """Ray's coordinator actor, ticking every second."""

    TICK_INTERVAL_S = 1


def install_coordinator() -> None:
    """The connected cluster's coordinator started as :class:`FastTickCoordinator`, under the name, namespace
    and options Ray's own ``get_or_create_autoscaling_coordinator`` gives it."""
    import ray

    coordinator._AutoscalingCoordinatorActor = FastTickCoordinator
    ray.get(coordinator.get_or_create_autoscaling_coordinator().get_reserved_resources.remote("warm-up"), timeout=60)


def _wait_step(pace: Path, world: int, after: int, ref, what: str) -> dict:
    """The first step logged at ``world`` workers after the ``after`` first lines."""
    import ray

    deadline = time.monotonic() + STEP_S
    while time.monotonic() < deadline:
        found = [s for s in pacing.steps(pace)[after:] if s["world"] == world]
        if found:
            return found[0]
        done, _ = ray.wait([ref], timeout=0.5)
        if done:
            ray.get(ref)  # raises the run's error
            raise RuntimeError(f"the run ended before {what}; steps: {pacing.steps(pace)}")
    raise TimeoutError(f"waited {STEP_S:g}s for {what}; steps: {pacing.steps(pace)}")


def _wait_notice_seen(temp: Path) -> None:
    """Until rank 0 has the notice: ``ray.train.get_preemption_info`` hands every rank rank 0's (Ray Train's worker
    logs "Rank 0 received preemption signal" as its watcher's call lands, worker_group/worker.py ``mark_preempt``)."""
    deadline = time.monotonic() + STEP_S
    while time.monotonic() < deadline:
        for path in temp.glob("session_*/logs/**/*"):
            if path.is_file() and "Rank 0 received preemption signal" in path.read_text(errors="replace"):
                return
        time.sleep(0.2)
    raise TimeoutError(f"waited {STEP_S:g}s for rank 0 to receive the preemption notice")


def scenario(cluster, config: Path, pace: Path, temp: Path) -> dict:
    import ray

    from contract.names import RAY_NOTICE_MODULE
    from training.config.run import load_run_config
    from training.ray import driver, notice

    t0 = time.monotonic()
    ref = driver.submit(load_run_config(config))
    _wait_step(pace, 3, 0, ref, "a step at 3 workers")
    first_s = time.monotonic() - t0
    ranked = {(pace / f"nodes-w3-r{r}").read_text() for r in range(3)}
    victim = next(n for n in cluster.worker_nodes if n.node_id in ranked)
    t1 = time.monotonic()
    prestop = subprocess.Popen([sys.executable, "-m", RAY_NOTICE_MODULE, "--address", cluster.address,
                                "--node-id", victim.node_id, "--deadline-s", str(NOTICE_DEADLINE_S),
                                "--wait-s", str(STEP_S)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_notice_seen(temp)
    seen = len(pacing.steps(pace))
    (pace / pacing.HOLD_FILE).unlink()  # the ranks go on to their next step boundary, where they see the notice
    saved = notice.node_dir(victim.node_id) / notice.SAVED
    deadline = time.monotonic() + STEP_S
    while not saved.exists():
        if time.monotonic() > deadline or prestop.poll() is not None:
            prestop.kill()
            raise TimeoutError(f"waited {STEP_S:g}s for the ranks' checkpoint on the notice ({saved}); steps: "
                               f"{pacing.steps(pace)}; preStop: {prestop.communicate()[0]}")
        time.sleep(0.1)
    (pace / pacing.HOLD_FILE).touch()  # the ranks wait at the notice; what follows is paced again
    try:
        said, _ = prestop.communicate(timeout=STEP_S)
    except subprocess.TimeoutExpired:
        prestop.kill()
        raise TimeoutError(f"waited {STEP_S:g}s for the preStop hook; steps: {pacing.steps(pace)}") from None
    if prestop.returncode != 0:
        raise RuntimeError(f"the preStop hook exited {prestop.returncode}: {said}")
    notice_s = time.monotonic() - t1
    t2 = time.monotonic()
    cluster.remove_node(victim)  # the pod's SIGTERM once its preStop hook returned
    _wait_step(pace, 2, seen, ref, "a step at 2 workers after the notice")
    shrink_s = time.monotonic() - t2
    seen = len(pacing.steps(pace))
    t3 = time.monotonic()
    cluster.add_node(num_cpus=1)
    _wait_step(pace, 3, seen, ref, "a step at 3 workers after a node was added")
    grow_s = time.monotonic() - t3
    (pace / pacing.HOLD_FILE).unlink()
    summaries = ray.get(ref, timeout=STEP_S)
    return {"first_step_s": round(first_s, 1), "notice_s": round(notice_s, 1), "shrink_s": round(shrink_s, 1),
            "grow_s": round(grow_s, 1), "run_s": round(time.monotonic() - t0, 1), "prestop": said.strip(),
            "placement": summaries["retriever"]["placement"]}


def _print_decisions(temp: Path) -> None:
    """Ray Train controller's sizing and failure decisions, from the cluster's logs (what each phase waited on)."""
    import re

    wanted = re.compile(r"Deciding to|Detected changes|\[FailurePolicy\]|WorkerGroupStartupTimeoutError|"
                        r"preemption detected|preemption notice")
    for path in sorted(temp.glob("session_*/logs/**/*")):
        if path.is_file() and path.suffix in (".log", ".err", ".out"):
            for line in path.read_text(errors="replace").splitlines():
                if wanted.search(line):
                    print(f"{path.name}: {line[:300]}", file=sys.stderr)


def main(argv: list[str]) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from tests.training.ray.conftest import ray_env
    from training.localdev.ray_head import PREEMPTION_WATCHER_ENV

    config, pace, temp = Path(argv[0]), Path(argv[1]), argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops the cluster
    ray_env()
    os.environ[PREEMPTION_POLL_ENV] = "0.5"
    os.environ[PREEMPTION_WATCHER_ENV] = "1"  # the watcher the other Ray tests leave off (ray_env) is the point here
    # Cluster records its address in the default Ray temp dir (/tmp/ray) whatever temp_dir says.
    os.makedirs(os.path.dirname(ray._private.utils.get_ray_address_file(None)), exist_ok=True)
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": temp})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        install_coordinator()
        result = {"cluster_s": round(time.monotonic() - t0, 1), **scenario(cluster, config, pace, Path(temp))}
    finally:
        _print_decisions(Path(temp))
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
