"""The queue's records (training/scheduler/queue_records.py), without Redis: a claim from the claim scripts'
reply, a task from its hash (fields an older task lacks take their defaults)."""

from __future__ import annotations

from tests.support.redis_fixtures import make_spec

from training.scheduler.queue_records import TERMINAL_STATES, Claim, State, TaskInfo


def test_a_claim_reads_the_scripts_reply_and_its_spec():
    spec = make_spec("rec-1")
    claim = Claim.from_reply("\x1f".join(["rec-1", "tok", spec.to_json(), "2", "3", "1.5", "2.5", "60"]))
    assert claim == Claim(task_id="rec-1", token="tok", spec_json=spec.to_json(), attempt=2, max_attempts=3,
                          enqueued_at=1.5, claimed_at=2.5, timeout_s=60.0)
    assert claim.spec == spec


def test_a_task_hash_reads_with_defaults_for_what_it_lacks():
    info = TaskInfo.from_hash({"id": "rec-2", "state": "dead", "attempts": "3", "created_at": "10.0",
                               "cancel_requested": "1", "last_error": "boom"})
    assert (info.task_id, info.state, info.attempts, info.created_at, info.cancel_requested) == \
        ("rec-2", State.DEAD, 3, 10.0, True)
    assert info.finished_at is None and info.preemptions == 0 and info.owner == "" and info.completions == 0
    assert info.state in TERMINAL_STATES and State.RUNNING not in TERMINAL_STATES
