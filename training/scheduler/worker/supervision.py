"""The child of one attempt: started in its own session, its output copied, its lease heartbeated, stopped on
cancel, lost lease, timeout or SIGTERM (forwarded once, then SIGKILL after the grace period)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from contract.paths import run_dir
from training.scheduler.queue_records import Claim, Heartbeat
from training.scheduler.worker import log
from training.scheduler.worker.outage import is_redis_error
from training.scheduler.worker.outcome import ChildExit, StopReason


class ChildSupervisor:
    """The :class:`training.scheduler.worker.loop.Worker`'s signals, child and heartbeat."""

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        log.info("worker %s: got %s, finishing up", self.config.worker_id, signal.Signals(signum).name)
        self.stopping.set()
        self._signal_child(signal.SIGTERM)

    def _signal_child(self, sig: int) -> None:
        with self._child_lock:
            child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, sig)  # torchrun and anything else in its session
            except ProcessLookupError:
                return
            if sig == signal.SIGTERM:
                self._sigterm_sent_to = child.pid

    def _supervise(self, cmd: list[str], env: dict[str, str], *, run_id: str, attempt: int, timeout_s: float,
                   lease: Claim | None, still_ours: Callable[[], bool] | None = None,
                   take_over: Callable[[], Claim | None] | None = None) -> ChildExit:
        """Run the child to its exit, enforcing timeout and shutdown. ``lease`` is the claim this
        pod holds: it is heartbeated, and a cancel or lost lease stops the child. A follower pod of
        a multi-node run passes None (index 0 holds the lease) and ``still_ours``, asked every poll interval:
        False (index 0's lease is gone: the run went back to its lane or ended) stops the child as a lost
        lease does, so a run whose index 0 died is never trained twice. A follower of an elastic run also
        passes ``take_over``, asked at the same polls while it holds no lease: the claim it returns (the
        holder's heartbeat went stale and this pod took the lease over, ``gang._take_over``) is heartbeated
        from then on, as ``lease`` is."""
        cfg = self.config
        log_dir = run_dir(cfg.shared_root, run_id) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"attempt-{attempt}-node-{cfg.node_index}.log"
        tail: collections.deque[str] = collections.deque(maxlen=40)
        with self._child_lock:
            if self.stopping.is_set() and lease is not None:
                return ChildExit(None, "", StopReason.SHUTDOWN)
            child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            self._child = child
        reader = threading.Thread(target=pump, args=(child, log_path, tail), daemon=True)
        reader.start()
        stopped: StopReason | None = None
        stop_heartbeat = threading.Event()
        verdict: dict[str, Heartbeat] = {}
        if lease is not None:
            beat = threading.Thread(target=self._heartbeat_loop, args=(lease, stop_heartbeat, verdict), daemon=True)
            beat.start()
        deadline = time.monotonic() + timeout_s
        next_check = time.monotonic() + cfg.poll_seconds
        signalled_at: float | None = None
        try:
            while True:
                try:
                    code = child.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if not stopped:
                    if verdict.get("state") in (Heartbeat.CANCEL, Heartbeat.LOST):
                        stopped = StopReason.CANCEL if verdict["state"] == Heartbeat.CANCEL else StopReason.LOST
                    elif self.stopping.is_set():
                        stopped = StopReason.SHUTDOWN  # the signal handler already forwarded SIGTERM
                    elif time.monotonic() > deadline:
                        stopped = StopReason.TIMEOUT
                    elif still_ours is not None and time.monotonic() >= next_check:
                        next_check = time.monotonic() + cfg.poll_seconds
                        if not still_ours():
                            log.warning("run %s: attempt %d no longer holds the run (its index 0 is gone); "
                                        "stopping this pod's share", run_id, attempt)
                            stopped = StopReason.LOST
                        elif lease is None and take_over is not None:
                            lease = take_over()
                            if lease is not None:
                                threading.Thread(target=self._heartbeat_loop, args=(lease, stop_heartbeat, verdict),
                                                 daemon=True).start()
                    if stopped:
                        # Once only: a second SIGTERM would cut torchrun's own shutdown short.
                        if self._sigterm_sent_to != child.pid:
                            self._signal_child(signal.SIGTERM)
                        signalled_at = time.monotonic()
                elif signalled_at is not None and time.monotonic() - signalled_at > cfg.stop_grace_seconds:
                    log.warning("run %s: no exit %.0fs after SIGTERM, killing", run_id, cfg.stop_grace_seconds)
                    self._signal_child(signal.SIGKILL)
                    signalled_at = None
        finally:
            stop_heartbeat.set()
            with self._child_lock:
                self._child = None
            reader.join(timeout=10)
        if not stopped and self.stopping.is_set() and code != 0:
            stopped = StopReason.SHUTDOWN
        if verdict.get("state") == Heartbeat.LOST:
            stopped = StopReason.LOST
        return ChildExit(code, "".join(tail), stopped)

    def _heartbeat_loop(self, claim: Claim, stop: threading.Event, verdict: dict[str, Heartbeat]) -> None:
        cfg = self.config
        while not stop.wait(cfg.heartbeat_seconds):
            try:
                state = self.queue.heartbeat(claim, cfg.worker_id)
                if cfg.nnodes > 1:
                    self.gang_group.touch()
            except Exception as exc:
                if not is_redis_error(exc):
                    raise
                log.warning("run %s: heartbeat failed (%s); retrying", claim.task_id, exc)
                continue
            if state in (Heartbeat.CANCEL, Heartbeat.LOST):
                verdict["state"] = state
                return


def pump(child: subprocess.Popen, log_path: Path, tail: collections.deque) -> None:
    """Copy the child's output to our stdout (pod logs), a per-attempt log file and a tail buffer."""
    with open(log_path, "a", encoding="utf-8", errors="replace") as log_file:
        for raw in iter(child.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            tail.append(line)
            log_file.write(line)
            log_file.flush()
            sys.stdout.write(line)
            sys.stdout.flush()
    child.stdout.close()
