"""The worker's outcome policy (training/scheduler/worker/outcome.py), without Redis: every exit code of
contract/exit_codes.py under every way a child can end, for both executors."""

from __future__ import annotations

import pytest

from contract import exit_codes
from training.scheduler.worker.outcome import Action, ChildExit, Decision, Outcome, StopReason, decide, outcome_of
from training.scheduler.queue_records import Release
from contract.lanes import EXECUTORS

EXIT_CODES = {name: value for name, value in vars(exit_codes).items() if name.isupper() and isinstance(value, int)}

#: What a child that exited on its own with each code gets recorded as: (action, retriable, release kind,
#: stop claiming) per executor. Every name of contract/exit_codes.py has a row (checked below).
ON_ITS_OWN = {
    "OK": {"torchrun": (Action.ACK, True, Release.GRACEFUL, False), "ray": (Action.ACK, True, Release.GRACEFUL, False)},
    "FAILED": {e: (Action.FAIL, True, Release.GRACEFUL, False) for e in EXECUTORS},
    "REFUSED": {e: (Action.FAIL, True, Release.GRACEFUL, False) for e in EXECUTORS},
    "BAD_INPUT": {e: (Action.FAIL, False, Release.GRACEFUL, False) for e in EXECUTORS},
    "NOT_FOUND": {e: (Action.FAIL, True, Release.GRACEFUL, False) for e in EXECUTORS},
    # Only a ray run's child (python -m training.ray.job) means "the Ray cluster is away" by it.
    "UNAVAILABLE": {"torchrun": (Action.FAIL, True, Release.GRACEFUL, False),
                    "ray": (Action.RELEASE, True, Release.UNAVAILABLE, True)},
    "HEALTH_CHECK_FAILED": {e: (Action.FAIL, True, Release.GRACEFUL, False) for e in EXECUTORS},
    "RETRIABLE": {e: (Action.RELEASE, True, Release.GRACEFUL, False) for e in EXECUTORS},
    # The worker's own exit, never a child's: a child that returns it fails like any other code.
    "GANG_TIMEOUT": {e: (Action.FAIL, True, Release.GRACEFUL, False) for e in EXECUTORS},
    # ragpool's own exit when its output pipe closed, never a stage's: a child that returns it fails.
    "BROKEN_PIPE": {e: (Action.FAIL, True, Release.GRACEFUL, False) for e in EXECUTORS},
}


def test_every_exit_code_has_a_row() -> None:
    assert set(ON_ITS_OWN) == set(EXIT_CODES), "a new exit code needs its row in ON_ITS_OWN (and maybe a rule)"
    assert all(set(row) == set(EXECUTORS) for row in ON_ITS_OWN.values())


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("name", sorted(EXIT_CODES))
def test_a_child_that_exits_on_its_own(name: str, executor: str) -> None:
    code = EXIT_CODES[name]
    decision = decide(ChildExit(code, "last line\n", None), executor=executor, timeout_s=60)
    action, retriable, release, stop = ON_ITS_OWN[name][executor]
    assert (decision.action, decision.retriable, decision.release, decision.stop_claiming) == \
        (action, retriable, release, stop), decision
    assert not decision.interrupted
    if action == Action.FAIL:
        assert decision.reason == f"exit code {code}\nlast line\n", "the error names the code and the tail"
    if action == Action.RELEASE:
        assert str(code) in decision.reason


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("code", sorted({*EXIT_CODES.values(), None, 137, -15}, key=str))
def test_a_child_the_worker_stopped(code: int | None, executor: str) -> None:
    def of(stopped: StopReason) -> Decision:
        return decide(ChildExit(code, "tail\n", stopped), executor=executor, timeout_s=90)

    # Lease gone: nothing is recorded whatever the child said (the run is someone else's now).
    assert of(StopReason.LOST) == Decision(Action.NOTHING)
    # A pending cancel is confirmed whatever the child said.
    assert of(StopReason.CANCEL) == Decision(Action.CANCELLED)
    if code == exit_codes.OK:  # it finished while being stopped: the work is done
        assert of(StopReason.SHUTDOWN) == of(StopReason.TIMEOUT) == Decision(Action.ACK)
        return
    # This worker's SIGTERM: torchrun exits 1 after a signal whatever the ranks do, so any exit is
    # an interruption, handed back without spending an attempt.
    assert of(StopReason.SHUTDOWN) == Decision(
        Action.RELEASE, f"interrupted by worker shutdown (SIGTERM); child exited {code}",
        release=Release.PREEMPTED, interrupted=True)
    # The holder of an elastic run first hands its lease to a survivor (its gang trains on), then hands back.
    assert decide(ChildExit(code, "tail\n", StopReason.SHUTDOWN), executor=executor, timeout_s=90,
                  elastic=True) == Decision(Action.HAND_OFF, f"interrupted by worker shutdown (SIGTERM); child "
                                                             f"exited {code}", release=Release.PREEMPTED, interrupted=True)
    # Past timeout_seconds: a failed attempt (retried), whatever the exit code.
    assert of(StopReason.TIMEOUT) == Decision(Action.FAIL, "timed out after 90s\ntail\n")


def test_a_child_that_never_started_and_was_not_stopped_is_a_failed_attempt() -> None:
    assert decide(ChildExit(None, "", None), executor="torchrun", timeout_s=1) == Decision(Action.FAIL, "exit code None\n")


@pytest.mark.parametrize("decision, reply, outcome", [
    (Decision(Action.NOTHING), None, Outcome.LOST),
    (Decision(Action.ACK), True, Outcome.SUCCEEDED),
    (Decision(Action.ACK), False, Outcome.LOST),  # the lease changed hands before the ack
    (Decision(Action.CANCELLED), "cancelled", Outcome.CANCELLED),
    (Decision(Action.CANCELLED), "stale", Outcome.STALE),
    (Decision(Action.FAIL, "x"), "retry", Outcome.RETRY),
    (Decision(Action.FAIL, "x", retriable=False), "dead", Outcome.DEAD),
    (Decision(Action.FAIL, "x"), "cancelled", Outcome.CANCELLED),
    (Decision(Action.FAIL, "x"), "stale", Outcome.STALE),
    (Decision(Action.RELEASE, "x"), "released", Outcome.RELEASED),
    (Decision(Action.RELEASE, "x"), "dead", Outcome.DEAD),  # free releases used up
    (Decision(Action.RELEASE, "x", release=Release.UNAVAILABLE, stop_claiming=True), "released", Outcome.RELEASED),
    (Decision(Action.RELEASE, "x", interrupted=True), "released", Outcome.INTERRUPTED),
    (Decision(Action.RELEASE, "x", interrupted=True), "dead", Outcome.INTERRUPTED),
    # An elastic run's holder leaving: a survivor took the lease, or nobody did and the run was handed back, or
    # the lease had changed hands before the hand-off (or before the release).
    (Decision(Action.HAND_OFF, "x", interrupted=True), "handed_off", Outcome.HANDED_OFF),
    (Decision(Action.HAND_OFF, "x", interrupted=True), "released", Outcome.INTERRUPTED),
    (Decision(Action.HAND_OFF, "x", interrupted=True), "stale", Outcome.LOST),
])
def test_the_queue_reply_gives_the_outcome(decision: Decision, reply, outcome: Outcome) -> None:
    assert outcome_of(decision, reply) is outcome
