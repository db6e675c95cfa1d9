"""A multi-node run's gang: index 0 gathers the other indices of its Indexed Job, each follower joins."""

from __future__ import annotations

import threading
import time
from enum import StrEnum
from functools import cached_property
from pathlib import Path

from contract import exit_codes
from training.scheduler.queue_records import Claim, Heartbeat, Release, State
from training.scheduler.spec import RunSpec
from training.scheduler.worker import log
from training.scheduler.worker.group import GangGroup
from training.scheduler.worker.outage import STOPPED, is_redis_error
from training.scheduler.worker.outcome import ChildExit, Decision, Outcome, StopReason


class Gang(StrEnum):
    """The ``state`` of a published multi-node group (a group without one is ``GO``: older workers)."""

    GATHERING = "gathering"
    """Index 0 holds the run and waits for the other indices to join."""
    GO = "go"
    """Every index joined: start torchrun."""
    ABORTED = "aborted"
    """Not all joined within the deadline: the run was handed back; every pod exits."""


GANG_POLL_S = 0.2
"""How often a gathering index 0, or a joined follower, looks at the gang."""
GANG_GO_MEMBER = "go"
"""Index 0 adds ``<task>-a<attempt>/go`` to the joined set when the gang forms (a follower that
polls after a short run already ended still knows it went)."""


GANG_TRAINS_ON = frozenset({Outcome.LOST, Outcome.HANDED_OFF})
"""Outcomes after which an elastic run trains on without this pod (its lease taken over or handed off): its
gang is the new holder's to keep."""
HANDOFF_WAIT_MIN_S = 5.0
"""The least a leaving holder waits for a survivor to take its handed-off lease (:func:`handoff_wait_s`)."""


def handoff_wait_s(config) -> float:
    """How long an elastic run's holder, leaving on SIGTERM, waits for a survivor to take the lease it handed off
    before it hands the run back: three of the survivors' polls (each asks for the lease once a poll), at least
    :data:`HANDOFF_WAIT_MIN_S`; a few seconds of the pod's grace period, spent after its child has exited."""
    return max(HANDOFF_WAIT_MIN_S, 3 * config.poll_seconds)


def takeover_stale_s(config) -> float:
    """How old the holder's heartbeat must be before an elastic run's survivor takes its lease over: halfway
    between one missed heartbeat and the lease's lapse (60 s leases, 20 s heartbeats: 40 s), so a live holder
    is never pushed aside and a survivor polling every ``poll_seconds`` comes before the keeper reaps it."""
    return config.heartbeat_seconds + (config.lease_seconds - config.heartbeat_seconds) / 2


def gang_member(key: tuple, index: int | str) -> str:
    """A pod's entry in its gang's joined set: ``<task>-a<attempt>/<index>``."""
    return f"{key[0]}-a{key[1]}/{index}"


class GangMember:
    """The :class:`training.scheduler.worker.loop.Worker`'s part in a gang: follower (index > 0) and index 0."""

    @cached_property
    def gang_group(self) -> GangGroup:
        """This pod's gang in Redis (a multi-node worker's; ``config.group`` names it)."""
        return GangGroup(self.queue, self.config.group, self.config.lease_seconds)

    def _run_follower(self) -> int:
        """Index > 0 of an Indexed Job: join whatever run index 0 publishes. Exits RETRIABLE when a SIGTERM cut its
        share short (the Job then replaces this index: its run may train on, or come back, without it)."""
        seen: tuple | None = None
        interrupted = False
        idle_since = time.monotonic()
        while not self.stopping.is_set():
            group = self._until_redis_answers(lambda _again: self.gang_group.read(),
                                              "queue unavailable")
            if group is STOPPED:
                break
            key = (group["task_id"], group["attempt"]) if group else None
            if group and key != seen:
                seen = key
                state = group.get("state", Gang.GO)
                if state == Gang.ABORTED or (state == Gang.GATHERING and not self._join_gang(key)):
                    log.warning("worker %s (index %d): the gang of run %s did not form; exiting", self.config.worker_id,
                                self.config.node_index, key[0])
                    return exit_codes.GANG_TIMEOUT
                self.ready.set()
                ended = self._run_share(group, key)
                interrupted = interrupted or (ended.stopped == StopReason.SHUTDOWN and ended.code != exit_codes.OK)
                self.tasks_done += 1
                self.ready.clear()
                idle_since = time.monotonic()
                if self.config.max_tasks and self.tasks_done >= self.config.max_tasks:
                    break
                continue
            # Before its first run a follower waits the gang deadline, whatever its idle exit: index 0
            # claims only once its own node is up, its image pulled and its health check done, which on
            # a cold pool comes after the followers' (round-4 audit, item 1). Past it index 0 is not
            # coming (its node could not be had): the gang failed, and so does the Job.
            if not self.tasks_done:
                if time.monotonic() - idle_since >= self.config.gang_deadline_seconds:
                    log.warning("worker %s (index %d): no run from index 0 within the gang deadline (%.0fs); "
                                "exiting", self.config.worker_id, self.config.node_index,
                                self.config.gang_deadline_seconds)
                    return exit_codes.GANG_TIMEOUT
            elif time.monotonic() - idle_since >= self.config.idle_exit_seconds:
                break
            self.stopping.wait(min(self.config.poll_seconds, 0.5))
        return self.retriable_code if interrupted else 0

    def _attempt_current(self, key: tuple) -> bool:
        """Whether the run of ``key`` (task, attempt) is still that attempt's: False once index 0's lease lapsed and
        the keeper put the run back, another attempt began, or the attempt failed or was cancelled. A run index 0
        acked (``succeeded``) is still ours: this pod's share ends on its own, a moment after index 0's. A Redis
        outage answers True: the run is not known to be lost, and the outage path decides (outage.py)."""
        try:
            info = self.queue.get(key[0])
        except Exception as exc:  # noqa: BLE001 (only Redis errors are expected; anything else is re-raised)
            if is_redis_error(exc):
                return True
            raise
        return info is not None and info.state in (State.RUNNING, State.SUCCEEDED) and info.attempts == key[1]

    def _run_share(self, group: dict, key: tuple) -> ChildExit:
        """This pod's share of the run ``group`` publishes (``key``: task, attempt), to its end."""
        # Index 0 validated the spec when it claimed it and wrote its run.yaml: this pod only builds
        # its own torchrun command from it.
        spec = RunSpec.from_validated_json(group["spec_json"])
        cmd, env = self._command(spec, Path(group["config"]), group["attempt"])
        # Index 0 holds the lease and heartbeats it: this pod only runs its share. Of an elastic run
        # (torch trains on without a lost pod) a survivor takes the lease over when index 0's pod dies,
        # and then records the run's end as index 0 would have.
        taken: list[Claim] = []
        ended = self._supervise(cmd, env, run_id=spec.run_id, attempt=group["attempt"],
                                timeout_s=spec.timeout_seconds, lease=None,
                                still_ours=lambda: self._attempt_current(key),
                                take_over=(lambda: self._take_over(key, taken))
                                if spec.min_nodes is not None else None)
        log.info("worker %s (index %d): run %s exited %s", self.config.worker_id,
                 self.config.node_index, spec.run_id, ended.code)
        if taken:
            self._record(taken[-1], ended, spec)
        return ended

    def _rejoin_elastic_run(self) -> bool:
        """Index 0 starting (a replacement pod: the Job replaced a lost one): when its gang already trains an
        elastic run (published ``go``, its attempt still running, its lease taken over by a survivor), this pod
        joins that run as a follower does, so the run grows back instead of this pod claiming another; True
        when it did. A fixed-size run's gang, or none, leaves it to claim as before."""
        try:
            group = self.gang_group.read()
        except Exception as exc:
            if not is_redis_error(exc):
                raise
            return False
        if not group or group.get("state", Gang.GO) != Gang.GO:
            return False
        key = (group["task_id"], group["attempt"])
        if RunSpec.from_validated_json(group["spec_json"]).min_nodes is None or not self._attempt_current(key):
            return False
        log.info("worker %s (index 0): its gang trains elastic run %s (attempt %d) without it; joining it",
                 self.config.worker_id, key[0], key[1])
        self.ready.set()
        self._run_share(group, key)
        self.ready.clear()
        return True

    def _take_over(self, key: tuple, taken: list[Claim]) -> Claim | None:
        """Follower of an elastic run: take the lease of run ``key`` (task, attempt) over when its holder's
        heartbeat is stale (``TaskQueue.take_over``: the same attempt, the old holder fenced); the claim (also
        appended to ``taken``), or None (the holder is live, another survivor won, Redis is away)."""
        cfg = self.config
        try:
            reply = self.queue.take_over(key[0], key[1], cfg.worker_id, stale_s=takeover_stale_s(cfg))
        except Exception as exc:
            if not is_redis_error(exc):
                raise
            return None
        if isinstance(reply, str):
            return None
        log.warning("worker %s (index %d): the holder of run %s (attempt %d) stopped heartbeating; this pod took "
                    "its lease over and records the run's end", cfg.worker_id, cfg.node_index, key[0], key[1])
        taken.append(reply)
        return reply

    def _hand_off(self, claim: Claim, decision: Decision) -> str:
        """The holder of an elastic run, shutting down (its pod got SIGTERM: a spot notice, a drain) after its child
        exited, while the rest of the gang may train on: hand the lease off (``TaskQueue.hand_off``) and wait up to
        :func:`handoff_wait_s` for a survivor to take it (``Outcome.HANDED_OFF``); when none does (every pod is
        leaving, or none is left), release the run as ``decision`` says and return the release's reply."""
        cfg, q = self.config, self.queue
        if q.hand_off(claim) != "handed":
            return "stale"
        deadline = time.monotonic() + handoff_wait_s(cfg)
        while time.monotonic() < deadline:
            info = q.get(claim.task_id)
            if info is None or info.state != State.RUNNING or info.attempts != claim.attempt:
                return "stale"
            if info.worker != cfg.worker_id:
                log.info("worker %s: handed its lease of run %s (attempt %d) to %s, which trains on", cfg.worker_id,
                         claim.task_id, claim.attempt, info.worker)
                return Outcome.HANDED_OFF
            time.sleep(GANG_POLL_S)
        log.warning("worker %s: no survivor took the lease of run %s within %.0fs; handing the run back",
                    cfg.worker_id, claim.task_id, handoff_wait_s(cfg))
        return q.release(claim, decision.reason, kind=decision.release)

    def _clear_group(self) -> None:
        """The holder's run ended: the followers see no run (the key expires on its own otherwise,
        ``GangGroup.ttl_s``). Not called when an elastic run trains on without this pod (:data:`GANG_TRAINS_ON`):
        its gang is the new holder's."""
        try:
            self.gang_group.clear()
        except Exception as exc:
            if not is_redis_error(exc):
                raise

    def _join_gang(self, key: tuple) -> bool:
        """Follower: join the gang index 0 is gathering for run ``key`` (task, attempt) and wait for
        its go; False when it aborts, disappears or the deadline passes (then this pod exits)."""
        cfg, gang = self.config, self.gang_group
        deadline = time.monotonic() + cfg.gang_deadline_seconds
        joined = False
        while not self.stopping.is_set() and time.monotonic() < deadline:
            try:
                if not joined:
                    gang.join(gang_member(key, cfg.node_index))
                    joined = True
                group = gang.read()
            except Exception as exc:
                if not is_redis_error(exc):
                    raise
                self.stopping.wait(GANG_POLL_S)
                continue
            if group and (group["task_id"], group["attempt"]) == key and group.get("state", Gang.GO) == Gang.GO:
                return True
            if not group or (group["task_id"], group["attempt"]) != key or group.get("state") == Gang.ABORTED:
                # Gone or replaced: it went (and maybe finished already) only if index 0 marked it so.
                try:
                    return gang_member(key, GANG_GO_MEMBER) in gang.members()
                except Exception as exc:
                    if not is_redis_error(exc):
                        raise
                    return False
            self.stopping.wait(GANG_POLL_S)
        return False

    def _gather(self, claim: Claim, info: dict, min_nodes: int | None = None) -> Outcome | None:
        """Index 0: publish the run as gathering and wait until every other index joined (an elastic run,
        ``min_nodes``: until that many pods are in; the later ones see go and join torch's rendezvous, and so
        does a pod the Job replaces) (then publish go and return None), heartbeating the lease meanwhile.
        Otherwise record and return the outcome: GANG_TIMEOUT (handed back, no attempt spent), INTERRUPTED,
        CANCELLED or LOST."""
        cfg, q, gang = self.config, self.queue, self.gang_group
        need = (min_nodes or cfg.nnodes) - 1
        key = (claim.task_id, claim.attempt)
        wanted = {gang_member(key, i) for i in range(1, cfg.nnodes)}
        gang.reset_members()
        gang.publish(claim, {**info, "state": Gang.GATHERING})
        stop_heartbeat = threading.Event()
        verdict: dict[str, Heartbeat] = {}
        threading.Thread(target=self._heartbeat_loop, args=(claim, stop_heartbeat, verdict), daemon=True).start()
        deadline = time.monotonic() + cfg.gang_deadline_seconds
        try:
            while True:
                try:
                    if len(wanted & gang.members()) >= need:
                        gang.join(gang_member(key, GANG_GO_MEMBER))
                        gang.publish(claim, {**info, "state": Gang.GO})
                        return None
                except Exception as exc:
                    if not is_redis_error(exc):
                        raise
                if verdict.get("state") in (Heartbeat.CANCEL, Heartbeat.LOST) or self.stopping.is_set() \
                        or time.monotonic() > deadline:
                    break
                self.stopping.wait(GANG_POLL_S)
        finally:
            stop_heartbeat.set()
        gang.publish(claim, {**info, "state": Gang.ABORTED})
        if verdict.get("state") == Heartbeat.LOST:
            return Outcome.LOST
        if verdict.get("state") == Heartbeat.CANCEL:
            return self._keep_trying(claim, lambda again: Outcome(q.cancelled(claim)))
        if self.stopping.is_set():
            self._keep_trying(claim, lambda again: q.release(claim, "interrupted by worker shutdown (SIGTERM) "
                                                                     "while its gang gathered"))
            return Outcome.INTERRUPTED
        missing = sorted(wanted - gang.members())
        reason = (f"gang timeout: {len(missing)} of {cfg.nnodes} pods did not join within "
                  f"{cfg.gang_deadline_seconds:.0f}s ({', '.join(m.rsplit('/', 1)[1] for m in missing)}); "
                  "handed back without spending an attempt")
        log.warning("run %s: %s", claim.task_id, reason)
        self._keep_trying(claim, lambda again: q.release(claim, reason, kind=Release.GANG_TIMEOUT))
        return Outcome.GANG_TIMEOUT
