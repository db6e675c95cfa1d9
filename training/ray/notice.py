"""A spot notice for a Ray Train stage: the node is drained as preempted, the ranks checkpoint and wait for it to go.

    python -m training.ray.notice --deadline-s 110 --wait-s 95     (the Ray GPU worker pod's preStop hook)

What Ray 2.58 does with a drained node (ray/train/v2/_internal/execution/preemption.py ``PreemptionWatcher``,
controller/controller.py ``_handle_preempting_state``, failure_handling/default.py, ray/exceptions.py
``ActorDiedError``): a node drained with the reason ``DRAIN_NODE_REASON_PREEMPTION`` (``ray drain-node``, the
GCS ``DrainNode`` call autoscaler v2 makes for its own terminations) is seen by Ray Train's watcher within its
poll interval, which tells every worker (``ray.train.get_preemption_info``); the controller then waits until every
rank has exited or the drain's deadline has passed, and restarts the group from the newest checkpoint, at the size
the cluster then has for an elastic stage. A worker that died with a drained node counts against
``FailureConfig.max_preemption_failures`` (unbounded here, training/ray/driver.py), not ``max_failures``. A pod
that is simply deleted gives none of that: its raylet dies, the loss is a failure, and the ranks lose every step
since the last periodic checkpoint.

A drained node's death is itself a preemption only if it dies after the deadline without unregistering
(gcs_node_manager.cc ``InferDeathInfo``); a pod's SIGTERM stops Ray gracefully, "expected termination", which
Ray Train counts as a failure. What does count is the controller's own deadline: while preempting it restarts the
group (a ``PreemptionError``, the preemption budget) once every rank has exited or the drain's deadline has passed,
and it fails fast only on a rank's error. So the ranks must not end on their own, and the node must stay until the
group has been restarted without it. The Ray GPU worker pods (infra/ray_cluster.py) run this as their preStop
hook, which Kubernetes runs before the SIGTERM, within the pod's grace period (a spot notice: Karpenter deletes
the pod as it drains the node):

1. it drains its own Ray node as preempted, the deadline ``--deadline-s`` (the grace period less a margin);
2. the stage's ranks (:class:`NoticeHook`, a step hook every Ray Train stage installs) see the notice at their next
   step boundary: they save a checkpoint of that step together, those on the drained node leave ``saved`` in this
   node's notice directory, rank 0 the stage's preempted marker (the resize is then marked ``notice``,
   training/elastic/resizes.py); then every rank waits at the boundary, at most until the deadline;
3. once ``saved`` is there it drains the node again with a deadline of now (Ray's drain overwrites the request; the
   controller takes the earliest deadline): the controller restarts the group from that checkpoint, without the
   draining node, at the size the cluster now has (an elastic stage) and with no step lost;
4. it returns once no rank registered on this node is alive (the group restarted elsewhere, or there was none), or
   ``--wait-s`` has passed; Kubernetes then sends SIGTERM and the node's Ray stops.

The notice directory (:data:`contract.env.RAY_NOTICE_DIR_ENV`, default :data:`DEFAULT_DIR`, in the pod's ``/tmp``)
holds one folder per Ray node: ``rank-<r>.pid`` of each rank on it, and ``saved``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from contract.env import RAY_NOTICE_DIR_ENV
from contract.exit_codes import BAD_INPUT, FAILED, OK

if TYPE_CHECKING:
    from training.components.loop import StepHook, Trainer

DEFAULT_DIR = "/tmp/ragpool-notice"
"""The notice directory when :data:`contract.env.RAY_NOTICE_DIR_ENV` is unset: in the Ray worker pod's ``/tmp``
(an emptyDir of the pod), which its preStop hook and its ranks share."""
DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"
"""The drain reason Ray Train counts as a preemption (ray/core/generated/autoscaler_pb2 ``DrainNodeReason``)."""
POLL_S = 0.5
"""How often the preStop hook looks for ``saved`` and for the node's ranks, and the waiting ranks at the clock."""
UNKNOWN_DEADLINE_S = 120.0
"""How long the ranks wait when the drain gave no deadline (Ray Train's own fallback,
ray/train/v2/_internal/constants.py ``DEFAULT_PREEMPTION_DEADLINE_S``)."""
SAVED = "saved"


def notice_dir(environ: dict[str, str] | None = None) -> Path:
    return Path((os.environ if environ is None else environ).get(RAY_NOTICE_DIR_ENV) or DEFAULT_DIR)


def node_dir(node_id: str, environ: dict[str, str] | None = None) -> Path:
    return notice_dir(environ) / node_id


# --------------------------------------------------------------------------- the ranks' side


class NoticeHook:
    """A step hook (training/components/loop.py) for a stage run by Ray Train: at each step boundary every rank
    asks Ray Train for a preemption notice (a broadcast from rank 0, so all ranks act on the same answer); on a new
    one they checkpoint the step, then wait for the drained node to go (module docstring)."""

    def __init__(self) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.handled: set[str] = set()
        self.registered = False

    def __call__(self, trainer: "Trainer") -> None:
        import ray.train

        from training.components.stage import write_json_atomic

        if not self.registered:
            self._register(trainer.env.rank)
        info = ray.train.get_preemption_info()
        if info is None or set(info.preempted_node_ids) <= self.handled:
            return
        nodes = sorted(set(info.preempted_node_ids) - self.handled)
        self.handled |= set(nodes)
        trainer.log.warning("preemption notice for node(s) %s (ranks %s): checkpointing step %d",
                            ",".join(n[:12] for n in nodes), info.preempted_ranks, trainer.step)
        self._checkpoint(trainer)
        if self.node_id in nodes:
            write_json_atomic(node_dir(self.node_id) / SAVED, trainer.step)
        deadline = info.deadline_ms / 1000 if info.deadline_ms else time.time() + UNKNOWN_DEADLINE_S
        self._hold(trainer, nodes, deadline)

    def _register(self, rank: int) -> None:
        from training.components.stage import write_json_atomic

        write_json_atomic(node_dir(self.node_id) / f"rank-{rank}.pid", os.getpid())
        self.registered = True

    @staticmethod
    def _checkpoint(trainer: "Trainer") -> None:
        """The current step saved (a collective: every rank, the same step). A periodic save of this very step
        (started just before the hooks, perhaps in the background) is only waited for."""
        every = trainer.cfg.checkpoint.every_steps
        if every and trainer.step % every == 0 and trainer.step < trainer.task.max_steps:
            trainer.ckpt.wait()
        else:
            trainer.save(blocking=True)  # waits for any background save first (training/components/checkpoint.py)
        trainer.mark_preempted()

    @staticmethod
    def _hold(trainer: "Trainer", nodes: list[str], deadline: float) -> None:
        """Wait at the step boundary until the controller restarts the group (this process is stopped) or the
        deadline passes (the drain was lifted, or nobody ended it): then training goes on."""
        while time.time() < deadline:
            time.sleep(POLL_S)
        trainer.log.warning("preemption notice: still here at the deadline (node(s) %s); training goes on",
                            ",".join(n[:12] for n in nodes))


def watcher_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether Ray Train's preemption watcher runs, as Ray reads its switch (ray/_common/utils.py ``env_bool``:
    on unless set to something other than ``1``/``true``). The local head turns it off
    (training/localdev/ray_head.py): no notice can come, so no rank need ask each step."""
    from training.localdev.ray_head import PREEMPTION_WATCHER_ENV

    value = (os.environ if environ is None else environ).get(PREEMPTION_WATCHER_ENV)
    return value is None or value.lower() in ("1", "true")


def step_hooks() -> list["StepHook"]:
    """The notice hook, for a stage Ray Train runs (training/ray/tasks.py ``train_worker``), unless Ray Train's
    preemption watcher is off."""
    return [NoticeHook()] if watcher_enabled() else []


# --------------------------------------------------------------------------- the preStop hook's side


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_ranks(folder: Path) -> list[int]:
    """The pids of the ranks registered in ``folder`` that are still running."""
    pids = []
    for path in folder.glob("rank-*.pid"):
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if _alive(pid):
            pids.append(pid)
    return pids


def drain_command(address: str, node_id: str, deadline_s: int, message: str) -> list[str]:
    """``ray drain-node`` (Ray's CLI: hidden, the same GCS call autoscaler v2 makes) for ``node_id``."""
    return [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address", address, "--node-id", node_id,
            "--reason", DRAIN_REASON, "--reason-message", message, "--deadline-remaining-seconds", str(deadline_s)]


def this_node_id(address: str) -> str:
    """The id of the Ray node on this host (the pod's raylet), through a short-lived driver."""
    import ray

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        return ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()


def wait_for(until, wait_s: float) -> bool:
    """Poll ``until()`` every :data:`POLL_S` for at most ``wait_s``; whether it came true."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if until():
            return True
        time.sleep(POLL_S)
    return bool(until())


def drain(address: str, node_id: str, deadline_s: int, message: str, timeout_s: float) -> str | None:
    """Drain ``node_id`` as preempted; None, or why it failed."""
    try:
        done = subprocess.run(drain_command(address, node_id, deadline_s, message), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"ray drain-node gave no answer in {timeout_s:g}s"
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-500:]


def parser() -> argparse.ArgumentParser:
    """The preStop hook's arguments (infra/ray_cluster.py ``notice_hook`` writes them)."""
    parser = argparse.ArgumentParser(prog="python -m training.ray.notice", description=__doc__.split("\n")[0])
    parser.add_argument("--deadline-s", type=int, required=True,
                        help="seconds until the node goes (the pod's terminationGracePeriodSeconds less a margin)")
    parser.add_argument("--wait-s", type=float, required=True, help="longest wait for the ranks' checkpoint")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or "auto", help="the Ray cluster")
    parser.add_argument("--node-id", help="the Ray node to drain (default: this host's)")
    parser.add_argument("--message", default="pod terminating (spot notice or drain)")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as err:
        return OK if err.code == 0 else BAD_INPUT
    if args.deadline_s < 1 or args.wait_s < 0:
        print(f"training.ray.notice: --deadline-s={args.deadline_s} --wait-s={args.wait_s:g}: need a deadline of "
              "at least 1 s and a wait of 0 s or more", file=sys.stderr)
        return BAD_INPUT
    t0 = time.monotonic()
    node_id = args.node_id or this_node_id(args.address)
    folder = node_dir(node_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SAVED).unlink(missing_ok=True)  # a notice before this one saved its own step

    def left() -> float:
        return max(0.0, args.wait_s - (time.monotonic() - t0))

    error = drain(args.address, node_id, args.deadline_s, args.message, timeout_s=max(10.0, left()))
    if error:
        print(f"training.ray.notice: drain of node {node_id} failed: {error}", file=sys.stderr)
        return FAILED
    if not live_ranks(folder):
        outcome = "no training rank on this node"
    elif wait_for(lambda: (folder / SAVED).exists() or not live_ranks(folder), left()) \
            and (folder / SAVED).exists():
        step = (folder / SAVED).read_text().strip()
        # The deadline brought forward to now: the controller restarts the group without this node.
        error = drain(args.address, node_id, 0, f"{args.message}: checkpoint of step {step} saved",
                      timeout_s=max(10.0, left()))
        gone = wait_for(lambda: not live_ranks(folder), left())
        outcome = (f"checkpoint of step {step} saved; " + ("the ranks restarted elsewhere" if gone else
                   f"the ranks still here after {args.wait_s:g}s") + (f" (second drain failed: {error})" if error else ""))
    else:
        outcome = f"no checkpoint after {args.wait_s:g}s" if live_ranks(folder) else "the ranks ended"
    print(f"training.ray.notice: node {node_id} drained as preempted ({args.deadline_s}s deadline); {outcome} "
          f"after {time.monotonic() - t0:.1f}s", flush=True)
    return OK

if __name__ == "__main__":
    sys.exit(main())
