"""Elastic torchrun, measured: a node lost mid-run, one that joins, one that gets the spot notice (SIGTERM).

    python -m bench.elastic [--max-steps 24] [--checkpoint-every 4] [--kill-at-step 6] [--timeout-s 120]
                            [--replacement-delay-s 300] [--sim-run-s 600]

1. A local ``redis-server`` (training/localdev/redis_server.py) and a run of the tiny stage
   ``bench/elastic_task.py`` (least squares through the real training loop) under ``--out``.
2. Three agents ``python -m training.elastic.launch --nnodes 2:3`` x 1 gloo rank on CPU. The ranks wait after
   ``--kill-at-step`` (the stage's ``hold_at``); one agent and its rank get SIGKILL (a lost node). The other two
   go on at world 2 from the newest checkpoint and wait after the grow step; a fourth agent starts (a
   replacement node), torch SIGTERMs the two ranks, which stop at a step boundary with a checkpoint, and three
   ranks go on. Four steps later one agent gets SIGTERM (a spot notice; its ranks get it from torch): every rank
   stops at the step boundary with a checkpoint and the other two finish the run at world 2.
3. Reference: the same run in one process; the elastic run's final weights must equal it (float tolerance).
4. One JSON line last:

   - ``resize_s``: SIGKILL -> the first step at world 2 (the stage's step records' wall clock);
   - ``grow_s``: the new agent started -> the first step at world 3 (torch import and rendezvous included);
   - ``lost_steps_sigkill``: steps done twice after the kill (the killed step - the step resumed from);
     goal <= ``checkpoint_every``; ``lost_steps_sigterm``: the same at the spot notice, goal 0;
     ``lost_steps_join``: at the join, goal 0; ``notice_resize_s``: SIGTERM -> the first step at world 2;
   - ``loss_continuity``: the first loss after each resize within [0.5 x min, 2 x max] of the 5 before it;
   - ``final_params_match``;
   - ``goodput_ratio`` (goal >= 1.5): the elastic run's samples per wall-second over the full-gang requeue's, over
     one node-loss trace, simulated from this run's measured figures (:func:`goodput`); ``goodput`` its inputs
     and outputs, ``goodput_goal_up_to_run_s`` the longest run that still meets the goal.

Why a simulation driven by the measured figures and not real processes for ``goodput_ratio``: the trace that
matters is minutes long (a 5-minute replacement delay, a run of the same order around it), far more than the
measured part may take on 2 cores; and today's alternative is the queue's requeue of the whole gang (worker,
lane, gang deadline, Job), which no local process reproduces faithfully. What the real processes measure are the
costs a resize and a restart have, and those drive the simulation:

- the trace: a run that needs ``--sim-run-s`` wall seconds on its full gang of 3 nodes loses one at mid-run
  (SIGKILL: no notice); a replacement node is available ``--replacement-delay-s`` later;
- elastic: ``resize_s`` down, the ``lost_steps_sigkill`` steps redone, training on 2 nodes until the
  replacement, ``grow_s`` down (no step lost: ``lost_steps_join``), the rest on 3;
- full-gang requeue (today): the run stops at the loss, waits for the replacement, restarts in ``grow_s`` (a
  fresh agent: interpreter, torch import, rendezvous, checkpoint load -> first step; the queue's claim and the
  pods' start come on top, so this favours the requeue), redoes the same steps, and trains the rest on 3;
- throughput proportional to the nodes (2 nodes: 2/3 of the samples per second). Real data parallelism scales
  below linear, so losing a node costs less than a third: the assumption is the one least kind to elastic. The
  measured per-step times are not used for it: on 2 shared cores the CPU ranks' step time does not scale with
  the world (the stage sleeps per step); the lost steps' seconds are the measured step time at full size.

Both alternatives train the same samples, so the ratio is the requeue's wall time over the elastic one's. It falls
with the run's length (one loss weighs less in a longer run): the default run of twice the delay (the loss at
mid-run, the rest as long as the wait) is the case the figure states; ``goodput_goal_up_to_run_s`` says for how
long a run the goal holds, and ``goodput["elastic_loss_s"]`` / ``["requeue_loss_s"]`` what the loss costs each in
wall seconds (the same for any run that outlasts the replacement delay).

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
from contract.env import NAMESPACE_ENV, REDIS_URL_ENV
from contract.paths import child_env

REPO = Path(__file__).resolve().parents[1]
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=5,last_call_timeout=1,join_timeout=60,close_timeout=5"
"""Heartbeat every 1-2 s, a node dead after 5 s without one (docs/DESIGN.md "Elastic torchrun runs": below 3
attempts live nodes are dropped), 1 s of last call once min nodes are in."""
NODES = (2, 3)
GOODPUT_GOAL = 1.5
"""Issue 42: elastic at least 1.5x the full-gang requeue's samples per wall-second."""
GLOBAL_BATCH, GRAD_ACCUM = 12, 2
"""6 micro-batches of 2 per step over 3 ranks x 2, over 2 ranks x 3, over 1 rank x 6: the same global batch."""


def write_config(root: Path, run_id: str, max_steps: int, checkpoint_every: int) -> Path:
    """The run config of the tiny stage (metrics off, blocking checkpoints)."""
    path = root / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump({
        "run_id": run_id, "shared_root": str(root), "device": "cpu", "metrics": {"port": 0, "log_every": 1},
        "retriever": {"global_batch_size": GLOBAL_BATCH, "grad_accum": GRAD_ACCUM, "max_steps": max_steps,
                      "optim": {"lr": 0.05, "warmup_steps": 0}},
        "checkpoint": {"every_steps": checkpoint_every, "async_save": False, "keep_latest_k": 2}}))
    return path


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (an agent's ranks)."""
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


@dataclass
class ElasticRun:
    """Agents of one elastic run of the tiny stage, started and lost on demand."""

    root: Path
    """Shared root (run config, run directory, the agents' logs)."""
    redis_url: str
    """The queue's Redis (the rendezvous)."""
    namespace: str
    """Its key namespace."""
    max_steps: int = 24
    """Steps of the run."""
    checkpoint_every: int = 4
    """Checkpoint interval in steps."""
    agents: list[subprocess.Popen] = field(default_factory=list)
    """Every agent started, in order."""

    def __post_init__(self) -> None:
        self.config = write_config(self.root, "elastic", self.max_steps, self.checkpoint_every)
        self.out = self.root / "runs" / "elastic" / elastic_task.STAGE
        self.out.mkdir(parents=True, exist_ok=True)

    def start_agent(self) -> subprocess.Popen:
        env = child_env(**{REDIS_URL_ENV: self.redis_url, NAMESPACE_ENV: self.namespace, "OMP_NUM_THREADS": "1",
                           "LOGLEVEL": "INFO", "PYTHONWARNINGS": "ignore"})
        cmd = [sys.executable, "-m", "training.elastic.launch", "--nnodes", f"{NODES[0]}:{NODES[1]}",
               "--nproc-per-node", "1", "--max-restarts", "3", "--monitor-interval", "0.2",
               "--rdzv-id", "elastic-a1", "--rdzv-conf", RDZV_CONF,
               "-m", elastic_task.__name__, "--config", str(self.config)]
        with self.log(len(self.agents)).open("w") as log:
            self.agents.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        return self.agents[-1]

    def log(self, i: int) -> Path:
        return self.root / f"agent{i}.log"

    def logs(self) -> str:
        """The tail of every agent's log (what a time-out shows)."""
        return "\n".join(f"--- agent {i}\n" + self.log(i).read_text()[-1500:] for i in range(len(self.agents)))

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
        """SIGKILL agent ``i`` and its ranks at once (a lost node); the moment it happened."""
        agent = self.agents[i]
        ranks = children(agent.pid)
        at = time.time()
        for pid in [agent.pid, *ranks]:
            os.kill(pid, signal.SIGKILL)
        agent.wait(10)
        return at

    def at(self, world: int, step: int):
        """A predicate: the step records at ``world`` from ``step`` on."""
        return lambda: [s for s in self.steps() if s["world"] == world and s["step"] >= step]

    def close(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(10)


def scenario(run: ElasticRun, kill_at: int, timeout_s: float) -> dict:
    """Three agents, one lost at ``kill_at``, a new one joining once two reached the grow step, to the end. The
    step records and the moments of the kill and the join."""
    grow_at = kill_at + 2 * run.checkpoint_every
    notice_at = grow_at + 4
    run.hold(kill_at)
    for _ in range(NODES[1]):
        run.start_agent()
    wait_until(run.at(3, kill_at), timeout_s, f"step {kill_at} at world 3", seen=run.logs)
    run.hold(grow_at)
    killed = run.lose(0)
    wait_until(run.at(2, grow_at), timeout_s, f"step {grow_at} at world 2 after the SIGKILL", seen=run.logs)
    joined = time.time()
    run.start_agent()
    wait_until(run.at(3, grow_at + 1), timeout_s, "world 3 again after a new agent joined", seen=run.logs)
    run.hold(notice_at)
    wait_until(run.at(3, notice_at), timeout_s, f"step {notice_at} at world 3", seen=run.logs)
    noticed = time.time()
    run.agents[1].send_signal(signal.SIGTERM)
    run.hold(None)  # the others must reach the next step's collective, where every rank learns of the stop
    wait_until(run.at(2, notice_at + 1), timeout_s, "world 2 after the spot notice", seen=run.logs)
    codes = [wait_exit(agent, timeout_s, f"agent {i}") for i, agent in enumerate(run.agents) if i > 1]
    wait_exit(run.agents[1], timeout_s, "the agent that got the spot notice")
    return {"steps": run.steps(), "killed": killed, "joined": joined, "noticed": noticed, "exit_codes": codes}


def figures(steps: list[dict], killed: float, joined: float, noticed: float, kill_at: int,
            checkpoint_every: int) -> dict:
    """The JSON figures of one scenario's step records (module docstring)."""
    worlds = [s["world"] for s in steps]
    shrink = worlds.index(2)
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


def goodput(run_s: float, delay_s: float, nodes: int, resize_s: float, grow_s: float, redo_s: float) -> dict:
    """One node of ``nodes`` lost at mid-run of a run that needs ``run_s`` wall seconds on all of them, a replacement
    ``delay_s`` later: the wall seconds of the elastic run and of the full-gang requeue, and the goodput ratio
    (module docstring). ``redo_s``: the lost steps' seconds at full size; ``grow_s`` is also the requeue's restart."""
    rate = (nodes - 1) / nodes  # the survivors' share of the full gang's samples per second
    left = run_s / 2 + redo_s  # full-gang seconds of work after the loss, the lost steps included
    on_survivors = max(0.0, delay_s - resize_s)  # wall seconds on the survivors before the replacement is there
    if left <= on_survivors * rate:
        elastic = run_s / 2 + resize_s + left / rate
    else:
        elastic = run_s / 2 + resize_s + on_survivors + grow_s + (left - on_survivors * rate)
    requeue = run_s / 2 + delay_s + grow_s + left
    return {"run_s": run_s, "replacement_delay_s": delay_s, "nodes": nodes, "resize_s": resize_s, "grow_s": grow_s,
            "redo_s": round(redo_s, 3), "elastic_s": round(elastic, 2), "requeue_s": round(requeue, 2),
            "elastic_loss_s": round(elastic - run_s, 2), "requeue_loss_s": round(requeue - run_s, 2),
            "ratio": round(requeue / elastic, 3)}


def goal_up_to(delay_s: float, nodes: int, resize_s: float, grow_s: float, redo_s: float) -> float:
    """The longest run (full-gang wall seconds, to 1 s) whose :func:`goodput` ratio still meets
    :data:`GOODPUT_GOAL` (0 when none does); the ratio falls as the run grows."""
    def meets(run_s: float) -> bool:
        return goodput(run_s, delay_s, nodes, resize_s, grow_s, redo_s)["ratio"] >= GOODPUT_GOAL

    lo, hi = 0.0, 1.0
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
    """The same run in one process: the path of its final weights."""
    config = write_config(root, "fixed", max_steps, checkpoint_every)
    subprocess.run([sys.executable, "-m", elastic_task.__name__, "--config", str(config)], cwd=REPO, check=True,
                   env=child_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"), capture_output=True,
                   timeout=timeout_s)
    return root / "runs" / "fixed" / elastic_task.STAGE / elastic_task.FINAL_FILE


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
    out["goodput_goal_up_to_run_s"] = goal_up_to(args.replacement_delay_s, NODES[1], out["resize_s"], out["grow_s"],
                                                 redo_s)
    out["goals"] = {"lost_steps_sigkill": out["lost_steps_sigkill"] <= args.checkpoint_every,
                    "lost_steps_sigterm": out["lost_steps_sigterm"] == 0, "lost_steps_join": out["lost_steps_join"] == 0,
                    "loss_continuity": out["loss_continuity"], "final_params_match": out["final_params_match"],
                    "goodput_ratio": out["goodput_ratio"] >= GOODPUT_GOAL,
                    "agents_exit_0": seen["exit_codes"] == [0] * len(seen["exit_codes"])}
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
