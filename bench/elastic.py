"""Elastic torchrun, measured: a node lost mid-run, one that joins, one that gets the spot notice (SIGTERM).

    python -m bench.elastic [--max-steps 24] [--checkpoint-every 4] [--kill-at-step 6] [--timeout-s 120]
                            [--replacement-delay-s 300] [--sim-run-s 600]

1. A local ``redis-server`` (training/localdev/redis_server.py), the queue on it and the run ``elastic`` of the tiny
   stage ``bench/elastic_task.py`` (least squares through the real training loop) submitted with ``nodes: {min:
   2, max: 3}``, the shared root under ``--out``.
2. Three worker pods of one Indexed Job, simulated as local processes (``python -m training.worker``, index 0
   claims and holds the lease, the gang goes at 2): each pod's child is the production elastic launch
   ``python -m training.elastic.launch --nnodes 2:3`` of the tiny stage (:func:`child`) x 1 gloo rank on CPU. The
   ranks wait after ``--kill-at-step`` (the stage's ``hold_at``); the pod holding the lease is SIGKILLed whole
   (worker, agent, rank: its node is gone). The other two go on at world 2 from the newest checkpoint, one of them
   takes the lease over, and they wait after the grow step; the Job's replacement pod for that index starts and
   joins the run, torch SIGTERMs the two ranks, which stop at a step boundary with a checkpoint, and three ranks go
   on. Four steps later the new holder's worker gets SIGTERM (a spot notice; it forwards it to its agent and rank):
   every rank stops at the step boundary with a checkpoint, the worker hands its lease off, and the other two finish
   the run at world 2, acked on its first attempt.
3. Reference: the same run in one process; the elastic run's final weights must equal it (float tolerance).
4. One JSON line last:

   - ``resize_s``: SIGKILL -> the first step at world 2 (the stage's step records' wall clock); goal <= the
     node's liveness (5 s here) + 15 s (:data:`RESIZE_SLACK_S`);
   - ``grow_s``: the replacement pod started -> the first step at world 3 (the worker's start, its joining the run,
     torch import and rendezvous included);
   - ``lost_steps_sigkill``: steps done twice after the kill (the killed step - the step resumed from);
     goal <= ``checkpoint_every``; ``lost_steps_sigterm``: the same at the spot notice, goal 0;
     ``lost_steps_join``: at the join, goal 0; ``notice_resize_s``: SIGTERM -> the first step at world 2;
   - ``loss_continuity``: the first loss after each resize within [0.5 x min, 2 x max] of the 5 before it;
   - ``final_params_match``; ``queue``: the run's state, attempts and takeovers (goal: succeeded, 1, 2);
   - ``goodput_ratio`` (goal >= 1.5): the elastic run's samples per wall-second, its lost node never replaced (the
     issue's definition), over the full-gang requeue's, whose replacement comes after the delay, over one
     node-loss trace simulated from this run's measured figures (:func:`goodput`); ``goodput_ratio_grown`` the
     same with the elastic run growing back when the replacement comes (what the pool does); ``goodput`` the
     inputs and outputs; ``goodput_goal_up_to_run_s`` the longest run that still meets the goal, and
     ``goodput_bound_up_to_run_s`` the same for an ideal elastic run (no resize cost, no step lost): the
     ceiling of any implementation.

Why a simulation driven by the measured figures and not real processes for ``goodput_ratio``: the trace that
matters is minutes long (a 5-minute replacement delay, a run of the same order around it), far more than the
measured part may take on 2 cores; and today's alternative is the queue's requeue of the whole gang (worker,
lane, gang deadline, Job), which no local process reproduces faithfully. What the real processes measure are the
costs a resize and a restart have, and those drive the simulation:

- the trace: a run that needs ``--sim-run-s`` wall seconds on its full gang of 3 nodes loses one at mid-run
  (SIGKILL: no notice); a replacement node is available ``--replacement-delay-s`` later;
- elastic: ``resize_s`` down, the ``lost_steps_sigkill`` steps redone, the rest on 2 nodes (the issue's
  definition); grown: on 2 nodes until the replacement, ``grow_s`` down (no step lost: ``lost_steps_join``), the
  rest on 3;
- full-gang requeue (today): the run stops at the loss, waits for the replacement, restarts in ``grow_s`` (a
  fresh agent: interpreter, torch import, rendezvous, checkpoint load -> first step; the queue's claim and the
  pods' start come on top, so this favours the requeue), redoes the same steps, and trains the rest on 3;
- throughput proportional to the nodes (2 nodes: 2/3 of the samples per second). Real data parallelism scales
  below linear, so losing a node costs less than a third: the assumption is the one least kind to elastic. The
  measured per-step times are not used for it: on 2 shared cores the CPU ranks' step time does not scale with
  the world (the stage sleeps per step); the lost steps' seconds are the measured step time at full size.

Both alternatives train the same samples, so the ratio is the requeue's wall time over the elastic one's. It falls
with the run's length (one loss weighs less in a longer run, and an unreplaced node's third is missed for longer):
the default run of twice the delay (the loss at mid-run, the rest as long as the wait) is the case the figure
states; ``goodput_goal_up_to_run_s`` says for how long a run the goal holds. Even an ideal elastic run meets 1.5
only while ``(T + D) / (T/2 + (T/2) x N/(N-1)) >= 1.5`` (T the run, D the delay, N nodes): T <= 343 s for 3 nodes
at D = 300 s (``goodput_bound_up_to_run_s``). ``goodput["elastic_grown_loss_s"]`` / ``["requeue_loss_s"]`` say
what the loss costs each in wall seconds when the elastic run grows back (the same for any run that outlasts the
replacement delay).

Every wait is bounded by ``--timeout-s`` and, on time-out, says what it waited for and what it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench import elastic_task
from bench.recovery import wait_exit, wait_until
from bench.report import finish
from contract import exit_codes
from contract.env import (CHILD_BUILDER_ENV, NAMESPACE_ENV, RDZV_HOST_ENV, REDIS_URL_ENV, WORKER_GROUP_ENV,
                          WORKER_ID_ENV)
from contract.lanes import Lane, worker_env
from contract.paths import SHARED_ROOT_ENV, child_env, run_dir
from contract.ports import RDZV_PORT
from training.scheduler.queue_records import Key
from training.scheduler.run_queue import TaskQueue
from training.scheduler.spec import RunSpec, parse_spec
from training.scheduler.worker.child import elastic_argv, run_env

REPO = Path(__file__).resolve().parents[1]
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=5,last_call_timeout=1,join_timeout=60,close_timeout=5"
"""Heartbeat every 1-2 s, a node dead after 5 s without one (docs/DESIGN.md "Elastic torchrun runs": below 3
attempts live nodes are dropped), 1 s of last call once min nodes are in."""
RESIZE_SLACK_S = 15.0
"""Issue 42: ``resize_s`` <= the lease (a node's liveness: :func:`liveness_s`) + the checkpoint's load + 15 s;
checked as <= lease + 15 s, which is stricter (the load is inside ``resize_s``)."""
NODES = (2, 3)
GOODPUT_GOAL = 1.5
"""Issue 42: elastic at least 1.5x the full-gang requeue's samples per wall-second."""
GLOBAL_BATCH, GRAD_ACCUM = 12, 2
"""6 micro-batches of 2 per step over 3 ranks x 2, over 2 ranks x 3, over 1 rank x 6: the same global batch."""
RUN_ID = "elastic"
LEASE_S = 6.0
"""The workers' lease (a heartbeat every 2 s; a survivor takes a dead holder's lease over after 4 s)."""
BUILDER = "bench.elastic:child"
"""The pods' ``RAGPOOL_WORKER_CHILD_BUILDER`` (:func:`child`; not ``__name__``, which is ``__main__`` under -m)."""
GROUP = "bench-elastic"
"""The pods' Indexed Job (``RAGPOOL_WORKER_GROUP``)."""


def liveness_s() -> float:
    """How long a node of the rendezvous lives without a heartbeat (``keep_alive_interval x keep_alive_max_attempt``
    of :data:`RDZV_CONF`): the lease a lost node holds the others to."""
    conf = dict(item.split("=") for item in RDZV_CONF.split(","))
    return float(conf["keep_alive_interval"]) * float(conf["keep_alive_max_attempt"])


def run_spec(max_steps: int, checkpoint_every: int) -> dict:
    """The run as ``ragpool submit`` takes it: the tiny stage on 2 to 3 nodes (metrics off, blocking checkpoints)."""
    return {"run_id": RUN_ID, "stages": ["retriever"], "nodes": {"min": NODES[0], "max": NODES[1]},
            "hyperparameters": {
                "retriever": {"global_batch_size": GLOBAL_BATCH, "grad_accum": GRAD_ACCUM, "max_steps": max_steps,
                              "optim.lr": 0.05, "optim.warmup_steps": 0},
                "run": {"device": "cpu", "metrics.port": 0, "metrics.log_every": 1,
                        "checkpoint.every_steps": checkpoint_every, "checkpoint.async_save": False,
                        "checkpoint.keep_latest_k": 2}}}


def child(spec: RunSpec, config: Path, attempt: int, *, shared_root: str, node_index: int = 0,
          rdzv_host: str = "127.0.0.1", rdzv_port: int = RDZV_PORT) -> tuple[list[str], dict[str, str]]:
    """The workers' child (``RAGPOOL_WORKER_CHILD_BUILDER=bench.elastic:child``): the production elastic launch
    (``training.scheduler.worker.child.elastic_argv``) of the tiny stage instead of ``training.pipeline``, with
    fast heartbeats (:data:`RDZV_CONF`), one gloo rank per node and one thread per rank."""
    entry = ["--monitor-interval", "0.2", "--rdzv-conf", RDZV_CONF, "-m", elastic_task.__name__, "--config",
             str(config)]
    argv = elastic_argv(entry, nproc=1, min_nodes=spec.min_nodes, max_nodes=spec.nodes,
                        rdzv_id=f"{spec.run_id}-a{attempt}", max_restarts=3)
    env = run_env(spec, config, attempt, shared_root=shared_root, node_index=node_index)
    return argv, {**env, "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO", "PYTHONWARNINGS": "ignore"}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a worker's child, an agent's ranks)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == str(pid):
                out.append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on."""
    found = children(pid)
    return found + [d for c in found for d in descendants(c)]


def kill_pod(pod: subprocess.Popen) -> None:
    """SIGKILL a pod's worker and everything under it, listed first so none escapes as an orphan."""
    for pid in [pod.pid, *descendants(pod.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pod.wait(10)


@dataclass
class ElasticRun:
    """One elastic run of the tiny stage on the queue, trained by real worker pods (``python -m training.worker``,
    an Indexed Job of 3 simulated as local processes) that are started, lost and noticed on demand."""

    root: Path
    """Shared root (the run's directory, the pods' logs)."""
    redis_url: str
    """The queue's Redis (also the rendezvous)."""
    namespace: str
    """Its key namespace."""
    max_steps: int = 24
    """Steps of the run."""
    checkpoint_every: int = 4
    """Checkpoint interval in steps."""
    pods: list[subprocess.Popen] = field(default_factory=list)
    """Every pod started, in order."""
    indexes: list[int] = field(default_factory=list)
    """Each pod's Job index."""

    def __post_init__(self) -> None:
        import redis

        self.client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.queue = TaskQueue(self.client, namespace=self.namespace, lease_seconds=LEASE_S)
        self.queue.submit(parse_spec(run_spec(self.max_steps, self.checkpoint_every), shared_root=str(self.root)))
        self.out = run_dir(str(self.root), RUN_ID) / elastic_task.STAGE
        self.out.mkdir(parents=True, exist_ok=True)

    def start_pod(self, index: int) -> subprocess.Popen:
        """Pod ``index`` of the Job (a replacement when that index ran before): its worker, its own session."""
        env = child_env(**{REDIS_URL_ENV: self.redis_url, NAMESPACE_ENV: self.namespace,
                           SHARED_ROOT_ENV: str(self.root), CHILD_BUILDER_ENV: BUILDER,
                           WORKER_GROUP_ENV: GROUP, RDZV_HOST_ENV: "127.0.0.1", "JOB_COMPLETION_INDEX": str(index),
                           WORKER_ID_ENV: f"pod{len(self.pods)}-index{index}",
                           **worker_env((Lane(nodes=NODES[1]),))})
        cmd = [sys.executable, "-m", "training.worker", "--lease-seconds", str(LEASE_S), "--poll-seconds", "0.2",
               "--idle-exit-seconds", "2", "--stop-grace-seconds", "60"]
        with self.log(len(self.pods)).open("w") as log:
            self.pods.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        self.indexes.append(index)
        return self.pods[-1]

    def log(self, i: int) -> Path:
        return self.root / f"pod{i}.log"

    def logs(self) -> str:
        """The tail of every pod's log (what a time-out shows)."""
        return "\n".join(f"--- pod {i}\n" + self.log(i).read_text()[-1500:] for i in range(len(self.pods)))

    def info(self):
        """The run's queue record."""
        return self.queue.get(RUN_ID)

    def holder(self) -> int:
        """Which pod holds the run's lease (its position in :attr:`pods`)."""
        return int(self.info().worker.split("-")[0].removeprefix("pod"))

    def steps(self) -> list[dict]:
        try:
            return [json.loads(line) for line in (self.out / elastic_task.STEPS_FILE).read_text().splitlines() if line]
        except (OSError, ValueError):  # not written yet, or a line being written
            return []

    def hold(self, step: int | None) -> None:
        """Make the ranks wait after ``step`` (None: never)."""
        path = self.out / elastic_task.HOLD_FILE
        if step is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(step))
        os.replace(tmp, path)

    def lose(self, i: int) -> float:
        """SIGKILL pod ``i``'s every process at once (its node is gone: worker, agent, ranks); the moment."""
        at = time.time()
        kill_pod(self.pods[i])
        return at

    def notice(self, i: int) -> float:
        """SIGTERM to pod ``i``'s worker (the kubelet's, on a spot notice); the moment."""
        at = time.time()
        self.pods[i].send_signal(signal.SIGTERM)
        return at

    def at(self, world: int, step: int):
        """A predicate: the step records at ``world`` from ``step`` on (RuntimeError once no pod is left to train)."""
        def seen() -> list[dict]:
            found = [s for s in self.steps() if s["world"] == world and s["step"] >= step]
            if not found and all(pod.poll() is not None for pod in self.pods):
                raise RuntimeError(f"every pod exited before step {step} at world {world}:\n{self.logs()}")
            return found
        return seen

    def close(self) -> None:
        for pod in self.pods:
            if pod.poll() is None:
                kill_pod(pod)
        self.client.close()


def scenario(run: ElasticRun, kill_at: int, timeout_s: float) -> dict:
    """Three pods; the lease's holder lost at ``kill_at`` (a survivor takes the lease over), its index replaced once
    two reached the grow step, the holder then noticed (it hands the lease off), to the end. The step records, the
    moments of the kill, the join and the notice, the pods' exit codes and the run's queue record."""
    grow_at = kill_at + 2 * run.checkpoint_every
    notice_at = grow_at + 4
    run.hold(kill_at)
    for index in range(NODES[1]):
        run.start_pod(index)
    wait_until(run.at(3, kill_at), timeout_s, f"step {kill_at} at world 3", seen=run.logs)
    first = run.holder()
    killed = run.lose(first)  # while the ranks wait after ``kill_at``: a hold lifted first let them take a step more
    run.hold(grow_at)
    wait_until(run.at(2, grow_at), timeout_s, f"step {grow_at} at world 2 after the SIGKILL", seen=run.logs)
    wait_until(lambda: run.holder() != first, timeout_s, "a survivor to take the lost holder's lease over",
               seen=lambda: run.info())
    joined = time.time()
    run.start_pod(run.indexes[first])  # the Job replaces the lost index
    wait_until(run.at(3, grow_at + 1), timeout_s, "world 3 again after the replacement pod joined", seen=run.logs)
    run.hold(notice_at)
    wait_until(run.at(3, notice_at), timeout_s, f"step {notice_at} at world 3", seen=run.logs)
    second = run.holder()
    noticed = run.notice(second)
    run.hold(None)  # the others must reach the next step's collective, where every rank learns of the stop
    wait_until(run.at(2, notice_at + 1), timeout_s, "world 2 after the spot notice", seen=run.logs)
    noticed_code = wait_exit(run.pods[second], timeout_s, "the pod that got the spot notice")
    codes = [wait_exit(pod, timeout_s, f"pod {i}") for i, pod in enumerate(run.pods) if i not in (first, second)]
    return {"steps": run.steps(), "killed": killed, "joined": joined, "noticed": noticed, "exit_codes": codes,
            "noticed_exit_code": noticed_code, "holders": [first, second, run.holder()], "info": run.info(),
            "takeovers": takeovers(run)}


def figures(steps: list[dict], killed: float, joined: float, noticed: float, kill_at: int,
            checkpoint_every: int) -> dict:
    """The JSON figures of one scenario's step records (module docstring)."""
    worlds = [s["world"] for s in steps]
    shrink = worlds.index(2, worlds.index(3))  # the pods start apart: the first round may be at 2 nodes
    grow = worlds.index(3, shrink)
    notice = worlds.index(2, grow)
    lost_kill = steps[shrink - 1]["step"] - (steps[shrink]["step"] - 1)
    # On a SIGTERM the ranks run one more step and save it (the stop skips the step records).
    lost_join = steps[grow - 1]["step"] + 1 - (steps[grow]["step"] - 1)
    lost_term = steps[notice - 1]["step"] + 1 - (steps[notice]["step"] - 1)

    def continuous(i: int) -> bool:
        before = [s["loss"] for s in steps[max(0, i - 5):i]]
        return 0.5 * min(before) <= steps[i]["loss"] <= 2 * max(before)

    return {"resize_s": round(steps[shrink]["t"] - killed, 2), "grow_s": round(steps[grow]["t"] - joined, 2),
            "notice_resize_s": round(steps[notice]["t"] - noticed, 2), "lost_steps_sigkill": lost_kill,
            "lost_steps_join": lost_join, "lost_steps_sigterm": lost_term, "checkpoint_every": checkpoint_every,
            "kill_at_step": kill_at, "loss_continuity": all(continuous(i) for i in (shrink, grow, notice)),
            "worlds": [worlds[0], worlds[shrink], worlds[grow], worlds[notice]], "final_step": steps[-1]["step"]}


def pods_exit_as_expected(seen: dict) -> bool:
    """The survivors exit 0 once the run is done; the noticed pod RETRIABLE (its index is replaced)."""
    return seen["exit_codes"] == [0] * len(seen["exit_codes"]) and seen["noticed_exit_code"] == exit_codes.RETRIABLE


def takeovers(run: ElasticRun) -> int:
    """How often the run's lease moved to a survivor (the queue's count on the task)."""
    return int(run.client.hget(run.queue.key(Key.TASK, RUN_ID), "takeovers") or 0)


def walls(run_s: float, delay_s: float, nodes: int, resize_s: float, grow_s: float,
          redo_s: float) -> tuple[float, float, float]:
    """The wall seconds of :func:`goodput`'s trace, unrounded: the elastic run never replaced, grown back, and the
    full-gang requeue."""
    rate = (nodes - 1) / nodes  # the survivors' share of the full gang's samples per second
    left = run_s / 2 + redo_s  # full-gang seconds of work after the loss, the lost steps included
    unreplaced = run_s / 2 + resize_s + left / rate
    on_survivors = max(0.0, delay_s - resize_s)  # wall seconds on the survivors before the replacement is there
    if left <= on_survivors * rate:
        grown = unreplaced
    else:
        grown = run_s / 2 + resize_s + on_survivors + grow_s + (left - on_survivors * rate)
    return unreplaced, grown, run_s / 2 + delay_s + grow_s + left


def goodput(run_s: float, delay_s: float, nodes: int, resize_s: float, grow_s: float, redo_s: float) -> dict:
    """One node of ``nodes`` lost at mid-run of a run that needs ``run_s`` wall seconds on all of them, a replacement
    ``delay_s`` later: the wall seconds of the elastic run (its node never replaced: ``elastic_s``; grown back when
    the replacement comes: ``elastic_grown_s``) and of the full-gang requeue, and the goodput ratios (module
    docstring). ``redo_s``: the lost steps' seconds at full size; ``grow_s`` is also the requeue's restart."""
    unreplaced, grown, requeue = walls(run_s, delay_s, nodes, resize_s, grow_s, redo_s)
    return {"run_s": run_s, "replacement_delay_s": delay_s, "nodes": nodes, "resize_s": resize_s, "grow_s": grow_s,
            "redo_s": round(redo_s, 3), "elastic_s": round(unreplaced, 2), "elastic_grown_s": round(grown, 2),
            "requeue_s": round(requeue, 2), "elastic_grown_loss_s": round(grown - run_s, 2),
            "requeue_loss_s": round(requeue - run_s, 2), "ratio": round(requeue / unreplaced, 3),
            "ratio_grown": round(requeue / grown, 3)}


def goal_up_to(delay_s: float, nodes: int, resize_s: float, grow_s: float, redo_s: float) -> float:
    """The longest run (full-gang wall seconds, to 1 s) whose goodput ratio (the issue's: never replaced) still
    meets :data:`GOODPUT_GOAL` (0 when none does); the ratio falls as the run grows."""
    def meets(run_s: float) -> bool:
        unreplaced, _, requeue = walls(run_s, delay_s, nodes, resize_s, grow_s, redo_s)
        return requeue / unreplaced >= GOODPUT_GOAL

    lo, hi = 1.0, 2.0  # a run of at least a second (an empty run has no rate)
    if not meets(lo):
        return 0.0
    while meets(hi) and hi < 1e7:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return float(int(lo))


def step_s(steps: list[dict], world: int) -> float:
    """The median wall seconds between consecutive step records at ``world`` (the measured step time)."""
    gaps = sorted(b["t"] - a["t"] for a, b in zip(steps, steps[1:])
                  if a["world"] == b["world"] == world and b["step"] == a["step"] + 1)
    return gaps[len(gaps) // 2] if gaps else 0.0


def reference(root: Path, max_steps: int, checkpoint_every: int, timeout_s: float) -> Path:
    """The same run in one process (the training config the workers wrote, under another run id): the path of its
    final weights."""
    spec = parse_spec({**run_spec(max_steps, checkpoint_every), "run_id": "fixed", "nodes": 1}, shared_root=str(root))
    config = root / "fixed.yaml"
    config.write_text(yaml.safe_dump(spec.to_training_config(str(root))))
    subprocess.run([sys.executable, "-m", elastic_task.__name__, "--config", str(config)], cwd=REPO, check=True,
                   env=child_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"), capture_output=True,
                   timeout=timeout_s)
    return run_dir(str(root), "fixed") / elastic_task.STAGE / elastic_task.FINAL_FILE


def params_match(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a), torch.load(b)
    return x.keys() == y.keys() and all(torch.allclose(x[k], y[k], rtol=1e-5, atol=1e-6) for k in x)


def measure(args: argparse.Namespace) -> dict:
    from training.localdev.redis_server import LocalRedisServer

    root = Path(args.out or tempfile.mkdtemp(prefix="bench-elastic-"))
    server = LocalRedisServer(data_dir=root / "redis").start()
    run = ElasticRun(root, server.url, "bench", args.max_steps, args.checkpoint_every)
    try:
        seen = scenario(run, args.kill_at_step, args.timeout_s)
    finally:
        run.close()
        server.stop()
    out = figures(seen["steps"], seen["killed"], seen["joined"], seen["noticed"], args.kill_at_step,
                  args.checkpoint_every)
    out["final_params_match"] = params_match(
        run.out / elastic_task.FINAL_FILE, reference(root, args.max_steps, args.checkpoint_every, args.timeout_s))
    redo_s = out["lost_steps_sigkill"] * step_s(seen["steps"], NODES[1])
    out["goodput"] = goodput(args.sim_run_s, args.replacement_delay_s, NODES[1], out["resize_s"], out["grow_s"], redo_s)
    out["goodput_ratio"] = out["goodput"]["ratio"]
    out["goodput_ratio_grown"] = out["goodput"]["ratio_grown"]
    out["goodput_bound_up_to_run_s"] = goal_up_to(args.replacement_delay_s, NODES[1], 0.0, 0.0, 0.0)
    out["goodput_goal_up_to_run_s"] = goal_up_to(args.replacement_delay_s, NODES[1], out["resize_s"], out["grow_s"],
                                                 redo_s)
    info = seen["info"]
    out["queue"] = {"state": info.state, "attempts": info.attempts, "takeovers": seen["takeovers"]}
    out["goals"] = {"resize_s": out["resize_s"] <= liveness_s() + RESIZE_SLACK_S,
                    "lost_steps_sigkill": out["lost_steps_sigkill"] <= args.checkpoint_every,
                    "lost_steps_sigterm": out["lost_steps_sigterm"] == 0, "lost_steps_join": out["lost_steps_join"] == 0,
                    "loss_continuity": out["loss_continuity"], "final_params_match": out["final_params_match"],
                    "goodput_ratio": out["goodput_ratio"] >= GOODPUT_GOAL,
                    "pods_exit": pods_exit_as_expected(seen),
                    "one_attempt_two_takeovers": out["queue"] == {"state": "succeeded", "attempts": 1, "takeovers": 2}}
    return out


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.elastic", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-steps", type=int, default=24, help="steps of the run (default 24)")
    p.add_argument("--checkpoint-every", type=int, default=4, help="checkpoint interval in steps (default 4)")
    p.add_argument("--kill-at-step", type=int, default=6, help="lose a node after this step (default 6)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="limit of each wait (default 120)")
    p.add_argument("--replacement-delay-s", type=float, default=300.0,
                   help="goodput simulation: a replacement node this long after the loss (default 300)")
    p.add_argument("--sim-run-s", type=float, default=600.0,
                   help="goodput simulation: the run's wall seconds on its full gang, the loss at mid-run (default 600)")
    p.add_argument("--out", default=None, help="working directory, new or empty (default: a new temporary one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    problems = []
    if args.checkpoint_every < 1 or args.timeout_s <= 0:
        problems.append("--checkpoint-every and --timeout-s must be positive")
    if args.replacement_delay_s < 0 or args.sim_run_s <= 0:
        problems.append("--replacement-delay-s must be >= 0 and --sim-run-s positive")
    if args.out and Path(args.out).exists() and any(Path(args.out).iterdir()):
        problems.append(f"--out {args.out}: not empty (a run's step records would mix with an earlier one's)")
    last = args.max_steps - 2 * args.checkpoint_every - 7  # room for the join and the notice 4 steps later
    if not 0 < args.kill_at_step <= last:
        problems.append(f"--kill-at-step must leave room for the join and the spot notice: in [1, {last}] for "
                        f"--max-steps {args.max_steps} and --checkpoint-every {args.checkpoint_every}")
    return finish("bench.elastic", problems, lambda: measure(args))


if __name__ == "__main__":
    sys.exit(main())
