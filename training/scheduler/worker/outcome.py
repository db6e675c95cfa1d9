"""How a claimed run's child ended, and what the worker records for it: a pure mapping.

:func:`decide` turns a child's exit (its exit code, its output's tail, and why the worker stopped
it, if it did) into a :class:`Decision`: which queue call records it, with what reason, and
whether the worker stops claiming afterwards. It talks to nothing (no Redis, no processes), so
every exit code of :mod:`contract.exit_codes` under every :class:`StopReason` is unit-tested
(tests/training/scheduler/worker/test_outcome.py); the worker (training/scheduler/worker/) makes
the one queue call the decision names and turns the queue's reply into an :class:`Outcome`.
In the style of Ray Train's ``FailurePolicy.make_decision`` -> ``FailureDecision`` (ray-project/ray
python/ray/train/v2/_internal/execution/failure_handling/failure_policy.py, commit d8cf1f9e): a pure
policy decides, the controller acts.

The rules, first match wins:

- lease lost (the heartbeat found it gone): record nothing;
- a pending ``ragpool cancel``: confirm the cancel;
- exit 0: ack (also when it finished while being stopped);
- this worker's SIGTERM (Kueue evicting the Job, spot reclaim, drain): hand the run back as preempted,
  no attempt spent however often (torchrun exits 1 after a signal whatever the ranks return, so any
  non-zero exit after *our* SIGTERM counts as interrupted); the holder of an elastic run (``nodes: {min,
  max}``), whose gang trains on without its pod, first hands its lease off to a survivor, and hands the run
  back only when none takes it;
- past the run's ``timeout_seconds``: a failed attempt (retried);
- ``RETRIABLE`` (75: preempted, checkpointed): hand it back;
- ``UNAVAILABLE`` (4) from a ray run's child (``python -m training.ray.job``: the Ray cluster is
  unreachable or refuses the token, not the run's fault): hand it back unspent and stop claiming;
- ``BAD_INPUT`` (2): failed for good (dead-letter list at once);
- anything else: a failed attempt (retried with backoff, dead-lettered after ``max_attempts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from contract import exit_codes
from training.scheduler.queue_records import Release


class Outcome(StrEnum):
    """What the worker recorded for one claimed task (:meth:`Worker.run_task`)."""

    SUCCEEDED = "succeeded"
    """Acked: the run's completion is recorded."""
    RETRY = "retry"
    """A failed attempt; the queue retries it after backoff."""
    DEAD = "dead"
    """Failed for good (not retriable, or attempts exhausted): dead-letter list."""
    CANCELLED = "cancelled"
    """Stopped by ``ragpool cancel``."""
    RELEASED = "released"
    """Handed back without spending an attempt (the child exited with the retriable code, or a ray
    run's child could not reach or authenticate to the Ray cluster: exit 4, the worker then stops)."""
    INTERRUPTED = "interrupted"
    """Handed back because this worker is shutting down (SIGTERM)."""
    LOST = "lost"
    """The lease was no longer ours (reaped or taken over): nothing recorded."""
    STALE = "stale"
    """The queue refused the record: the lease had changed hands meanwhile."""
    GANG_TIMEOUT = "gang_timeout"
    """Multi-node: not all pods joined within the gang deadline; handed back, no attempt spent."""
    HANDED_OFF = "handed_off"
    """An elastic run's holder, shutting down (SIGTERM), handed its lease to a survivor: the run trains on."""


class StopReason(StrEnum):
    """Why the worker stopped a child before it exited on its own."""

    CANCEL = "cancel"
    """A pending cancel reported by the heartbeat."""
    LOST = "lost"
    """The heartbeat found the lease gone."""
    SHUTDOWN = "shutdown"
    """This worker got SIGTERM/SIGINT."""
    TIMEOUT = "timeout"
    """The attempt ran past the run's ``timeout_seconds``."""


class ChildExit(NamedTuple):
    """How a supervised child ended."""

    code: int | None
    """Its exit code (None when it was never started)."""
    tail: str
    """The last lines of its output."""
    stopped: StopReason | None
    """Why we stopped it, or None when it exited on its own."""


class Action(StrEnum):
    """The one queue call that records a decision (``TaskQueue`` method)."""

    NOTHING = "nothing"
    """The lease is not ours any more: no call (the outcome is ``LOST``)."""
    CANCELLED = "cancelled"
    """``TaskQueue.cancelled``: confirm the pending cancel."""
    ACK = "ack"
    """``TaskQueue.ack``: the run succeeded."""
    RELEASE = "release"
    """``TaskQueue.release(reason, kind=release)``: hand the run back."""
    FAIL = "fail"
    """``TaskQueue.fail(reason, retriable=retriable)``: a failed attempt."""
    HAND_OFF = "hand_off"
    """``TaskQueue.hand_off`` and a bounded wait for a survivor's takeover; if none comes, RELEASE as
    ``reason`` and ``release`` say."""


@dataclass(frozen=True)
class Decision:
    """What to record for one ended child (:func:`decide`)."""

    action: Action
    """The queue call."""
    reason: str = ""
    """The error or release reason the call records (RELEASE, FAIL)."""
    retriable: bool = True
    """FAIL: whether the queue may retry it (False: dead-letter list at once)."""
    release: Release = Release.GRACEFUL
    """RELEASE: which kind of hand-back (whether it may spend an attempt)."""
    interrupted: bool = False
    """RELEASE: this worker is shutting down; the outcome is ``INTERRUPTED`` whatever the reply."""
    stop_claiming: bool = False
    """After recording, the worker claims nothing more (every run of its lanes would end the same)."""


def decide(ended: ChildExit, *, executor: str, timeout_s: float, elastic: bool = False) -> Decision:
    """The decision for ``ended``, a child of a run of ``executor`` with ``timeout_s`` per attempt
    (``elastic``: a run of ``nodes: {min, max}``) (the rules are in the module docstring)."""
    code, tail, stopped = ended
    if stopped == StopReason.LOST:
        return Decision(Action.NOTHING)
    if stopped == StopReason.CANCEL:
        return Decision(Action.CANCELLED)
    if code == exit_codes.OK:
        return Decision(Action.ACK)
    if stopped == StopReason.SHUTDOWN:
        return Decision(Action.HAND_OFF if elastic else Action.RELEASE,
                        f"interrupted by worker shutdown (SIGTERM); child exited {code}",
                        release=Release.PREEMPTED, interrupted=True)
    if stopped == StopReason.TIMEOUT:
        return Decision(Action.FAIL, f"timed out after {timeout_s:.0f}s\n{tail}")
    if code == exit_codes.RETRIABLE:
        return Decision(Action.RELEASE, f"child exited with the retriable code {code}")
    if code == exit_codes.UNAVAILABLE and executor == "ray":
        return Decision(Action.RELEASE, f"exit code {code}\n{tail}", release=Release.UNAVAILABLE, stop_claiming=True)
    return Decision(Action.FAIL, f"exit code {code}\n{tail}", retriable=code != exit_codes.BAD_INPUT)


def outcome_of(decision: Decision, reply: str | bool | None) -> Outcome:
    """The :class:`Outcome` of ``decision`` once the queue answered its call with ``reply``
    (``ack``: a bool; ``release``/``fail``/``cancelled``: the script's state word; NOTHING: None)."""
    if decision.action == Action.NOTHING:
        return Outcome.LOST
    if decision.action == Action.HAND_OFF:  # the hand-off's word, else the release's
        return {Outcome.HANDED_OFF: Outcome.HANDED_OFF, "stale": Outcome.LOST}.get(reply, Outcome.INTERRUPTED)
    if decision.action == Action.ACK:
        return Outcome.SUCCEEDED if reply else Outcome.LOST
    if decision.action == Action.RELEASE:
        if decision.interrupted:
            return Outcome.INTERRUPTED
        return Outcome.DEAD if reply == Outcome.DEAD else Outcome.RELEASED
    return Outcome(reply)
