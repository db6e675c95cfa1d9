"""bench/keda_scaledjob.py against the cases of KEDA's own tests at the pinned tag (v2.20.2):
``pkg/scaling/executor/scale_jobs_test.go`` (strategies, scaling decision, pending Jobs) and
``pkg/scaling/scale_handler_test.go`` ``TestGetScaledJobState`` (multipleScalersCalculation);
then the Redis scaler's Lua script on a real redis-server."""

from __future__ import annotations

import pytest

from bench import keda_scaledjob as keda
from bench.keda_scaledjob import PodView


def strategy(name: str, deduction: int | None = 0, percentage: str | None = "0") -> dict:
    """``getMockScaledJobWithStrategy`` (None leaves a field unset)."""
    out: dict = {"strategy": name}
    if deduction is not None:
        out["customScalingQueueLengthDeduction"] = deduction
    if percentage is not None:
        out["customScalingRunningJobPercentage"] = percentage
    return out


def effective(s: dict, *args: int) -> int:
    return keda.effective_max_scale(s, *args)[0]


def test_new_scaling_strategy_selects_like_keda():  # TestNewNewScalingStrategy
    assert keda.select_strategy(strategy("custom", 10, "0")) == "custom"
    assert keda.select_strategy(strategy("accurate")) == "accurate"
    assert keda.select_strategy({}) == "default"
    assert keda.select_strategy(strategy("default")) == "default"
    assert keda.select_strategy(strategy("eager")) == "eager"
    # An empty or unparsable percentage falls back to default (TestCustomScalingStrategy).
    assert keda.select_strategy(strategy("custom", 1, "")) == "default"
    assert keda.select_strategy(strategy("custom", None, None)) == "default"


def test_default_strategy():  # TestDefaultScalingStrategy
    assert effective({}, 3, 2, 0, 5, 1) == 1
    assert effective({}, 2, 0, 0, 5, 1) == 2


def test_custom_strategy():  # TestCustomScalingStrategy, TestCustomScalingStrategyNilQueueLengthDeduction
    s = strategy("custom", 1, "0.5")
    assert effective(s, 3, 2, 0, 5, 1) == 1
    assert effective(s, 10, 0, 0, 10, 1) == 9
    assert effective(strategy("custom", 2, "0"), 3, 2, 0, 5, 1) == 1
    assert effective(strategy("custom", -2, "0"), 3, 2, 0, 4, 1) == 4  # capped at maxReplicaCount
    nil_deduction = strategy("custom", None, "0.5")
    assert effective(nil_deduction, 10, 2, 0, 100, 1) == 9
    assert effective(nil_deduction, 10, 0, 0, 100, 1) == 10


@pytest.mark.parametrize("args, expected", [
    ((3, 2, 0, 5, 1), 3), ((5, 2, 0, 5, 1), 3),
    ((3, 4, 2, 10, 1), 1), ((5, 4, 2, 5, 1), 1),
    ((3, 3, 3, 5, 1), 0), ((15, 15, 15, 20, 1), 0), ((10, 10, 10, 15, 1), 0),
    ((20, 15, 10, 20, 1), 5),
])
def test_accurate_strategy(args, expected):  # TestAccurateScalingStrategy
    assert effective(strategy("accurate"), *args) == expected


@pytest.mark.parametrize("args, expected", [
    ((4, 3, 0, 10, 1), (4, 10)), ((4, 0, 3, 10, 1), (4, 10)), ((4, 7, 0, 10, 1), (3, 10)),
    ((4, 1, 6, 10, 1), (3, 10)), ((15, 0, 0, 10, 1), (10, 10)),
])
def test_eager_strategy(args, expected):  # TestEagerScalingStrategy
    assert keda.effective_max_scale(strategy("eager"), *args) == expected


@pytest.mark.parametrize("min_replicas, running, scale_to, max_scale, expected", [
    (2, 0, 0, 0, (2, 2)),  # TestRunningJobCountSmallerMinReplicaCount
    (2, 1, 0, 0, (1, 1)),  # TestRunningJobCountIsDeductedFromMinReplicaCount
    (1, 1, 2, 2, (2, 2)),  # TestRunningJobCountGreaterOrEqualMinReplicaCountExecutesScalingStrategy
])
def test_scaling_decision(min_replicas, running, scale_to, max_scale, expected):
    spec = {"minReplicaCount": min_replicas, "maxReplicaCount": 100}
    assert keda.scaling_decision(spec, running, scale_to, max_scale, 0) == expected


READY, SCHEDULED = "Ready", "PodScheduled"


@pytest.mark.parametrize("conditions, pods, pending", [
    ((), [PodView("Succeeded")], False),
    ((), [PodView("Running")], False),
    ((), [PodView("Failed")], True),
    ((), [PodView("Pending")], True),
    ((), [PodView("Unknown")], True),
    ((READY, SCHEDULED), [PodView("Running")], True),
    ((READY, SCHEDULED), [PodView("Running", frozenset({READY}))], True),
    ((READY, SCHEDULED), [PodView("Running", frozenset({SCHEDULED}))], True),
    ((READY, SCHEDULED), [PodView("Running", frozenset({READY, SCHEDULED}))], False),
    ((READY, SCHEDULED), [PodView("Running", frozenset({READY, SCHEDULED})),
                          PodView("Running", frozenset({READY, SCHEDULED}))], False),
    ((READY, SCHEDULED), [PodView("Running", frozenset({READY, SCHEDULED})),
                          PodView("Running", frozenset({READY}))], False),
    ((READY, SCHEDULED), [PodView("Running", frozenset({READY})), PodView("Running", frozenset({SCHEDULED}))], True),
    ((READY, SCHEDULED), [PodView("Running"), PodView("Running", frozenset({READY})),
                          PodView("Running", frozenset({READY, SCHEDULED}))], False),
    ((READY, SCHEDULED), [PodView("Running"), PodView("Running", frozenset({READY})),
                          PodView("Running", frozenset({SCHEDULED}))], True),
    ((), [PodView("Running", frozenset({READY}))], False),
])
def test_pending_job(conditions, pods, pending):  # TestGetPendingJobCount
    assert keda.job_is_pending(pods, conditions) is pending


def test_pending_with_ready_condition_only_counts_a_running_unready_worker():
    """The case ragpool relies on (pendingPodConditions: [Ready]): a worker pod Running but not
    Ready (no claim yet) keeps its Job pending; the phase alone would not."""
    assert keda.job_is_pending([PodView("Running")], ["Ready"]) is True
    assert keda.job_is_pending([PodView("Running")], []) is False


def test_get_scaled_job_state_single_trigger():  # TestGetScaledJobState, first part
    spec = {"minReplicaCount": 1, "maxReplicaCount": 100}
    assert keda.scaled_job_state(spec, [(20, 2, True)]) == (True, 20, 10)


FOUR_TRIGGERS = [(20, 1, True), (10, 2, True), (5, 3, True), (7, 4, False)]


@pytest.mark.parametrize("max_replicas, calculation, queue_length, max_value", [
    (100, "max", 20, 20), (100, "min", 5, 2), (100, "avg", 12, 9), (100, "sum", 35, 27), (25, "sum", 35, 25),
])
def test_get_scaled_job_state_multiple_scalers(max_replicas, calculation, queue_length, max_value):
    spec = {"minReplicaCount": 0, "maxReplicaCount": max_replicas,
            "scalingStrategy": {"multipleScalersCalculation": calculation}}
    assert keda.scaled_job_state(spec, FOUR_TRIGGERS) == (True, queue_length, max_value)


def test_empty_queue_with_min_replicas_is_active():  # TestGetScaledJobStateIfQueueEmptyButMinReplicaCountGreaterZero
    assert keda.scaled_job_state({"minReplicaCount": 1, "maxReplicaCount": 100}, [(0, 1, True)]) == (True, 0, 0)


def test_replica_counts_and_defaults():
    assert keda.max_replica_count({}) == 100 and keda.min_replica_count({}) == 0
    assert keda.max_replica_count({"minReplicaCount": 2, "maxReplicaCount": 10}) == 8
    assert keda.max_replica_count({"minReplicaCount": 12, "maxReplicaCount": 10}) == 10
    assert keda.min_replica_count({"minReplicaCount": 12, "maxReplicaCount": 10}) == 10
    assert keda.polling_interval_s({}) == 30 and keda.polling_interval_s({"pollingInterval": 5}) == 5


def test_accurate_never_starts_a_second_job_for_a_run_whose_job_is_pending():
    """One queued run whose Job is pending (node coming): accurate starts nothing more. One run
    claimed (its Job Ready) and one new run queued: accurate starts one Job, default none (it
    deducts every unfinished Job from the queue, so a running Job hides a queued run)."""
    spec = {"maxReplicaCount": 10, "scalingStrategy": {"strategy": "accurate", "multipleScalersCalculation": "sum"}}
    active, queue, max_scale = keda.scaled_job_state(spec, [(1, 1, True), (0, 1, False)])
    assert keda.jobs_to_create(spec, is_active=active, scale_to=queue, max_scale=max_scale, running=1, pending=1) == 0
    # One run claimed (its Job Ready), one new run queued: accurate starts one Job ...
    assert keda.jobs_to_create(spec, is_active=active, scale_to=queue, max_scale=max_scale, running=1, pending=0) == 1
    # ... default starts none (maxScale - running = 0): the new run waits for the first to end.
    default = {**spec, "scalingStrategy": {"multipleScalersCalculation": "sum"}}
    assert keda.jobs_to_create(default, is_active=active, scale_to=queue, max_scale=max_scale, running=1, pending=0) == 0
    # At maxReplicaCount nothing starts, whatever the queue.
    assert keda.jobs_to_create(spec, is_active=True, scale_to=5, max_scale=5, running=10, pending=0) == 0


def test_the_redis_scaler_script_reads_lists_and_other_types(redis_server):
    client = redis_server.client()
    try:
        client.delete("k:list", "k:zset", "k:str", "k:none")
        client.lpush("k:list", "a", "b", "c")
        client.zadd("k:zset", {"x": 1, "y": 2})
        client.set("k:str", "v")
        assert keda.redis_list_length(client, "k:list") == 3
        assert keda.redis_list_length(client, "k:none") == 0
        assert keda.redis_list_length(client, "k:zset") == 2
        with pytest.raises(Exception, match="unsupported key type: string"):
            keda.redis_list_length(client, "k:str")
    finally:
        client.delete("k:list", "k:zset", "k:str")
        client.close()
