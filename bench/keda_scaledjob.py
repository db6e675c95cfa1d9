"""KEDA's ScaledJob job-count algorithm, transcribed line for line (no Kubernetes, no torch).

Source: kedacore/keda tag v2.20.2 (commit 68a5b5028f35b22d50597c69819ab32c4e92f21a, the newest
stable release and the version infra installs: ``infra/charts.py`` ``KEDA_APP_TAG`` /
``KEDA_APP_COMMIT``, re-exported here as ``KEDA_TAG`` / ``KEDA_COMMIT``), Apache-2.0:

- ``pkg/scaling/scale_handler.go``: ``startScaleLoop`` (one check per ``pollingInterval``),
  ``checkScalers``, ``getScaledJobMetrics`` (per trigger: metrics and activity, then
  ``CalculateQueueLengthAndMaxValue``), ``getScaledJobState``;
- ``pkg/scaling/scaledjob/metrics.go``: ``CalculateQueueLengthAndMaxValue``,
  ``IsScaledJobActive`` (``multipleScalersCalculation`` max / min / avg / sum), ``getMaxValue``;
- ``pkg/scaling/executor/scale_jobs.go``: ``RequestJobScale``, ``getScalingDecision``,
  ``createJobs``, ``getRunningJobCount``, ``getPendingJobCount`` (``pendingPodConditions``,
  ``areAllPendingPodConditionsFulfilled``, ``isAnyPodRunningOrCompleted``), the strategies
  ``default`` / ``custom`` / ``accurate`` / ``eager`` (``NewScalingStrategy``);
- ``apis/keda/v1alpha1/scaledjob_types.go``: ``MaxReplicaCount()`` / ``MinReplicaCount()``
  (defaults 100 / 0); ``apis/keda/v1alpha1/withtriggers_types.go``: ``pollingInterval`` default 30 s;
- ``pkg/scalers/redis_scaler.go``: the Redis scaler's Lua script (``REDIS_SCALER_LUA``: the
  command KEDA sends is ``EVAL <script> 1 <listName>``), ``listLength`` default 5 (the
  per-Job target, an ``AverageValue``), ``activationListLength`` default 0, active when the
  length is greater than the activation length.

The unit tests (tests/bench/test_keda_scaledjob.py) replay the cases of KEDA's own
``pkg/scaling/executor/scale_jobs_test.go`` and ``pkg/scaling/scale_handler_test.go``
(``TestGetScaledJobState``) at the same tag. Go's ``int64(x)`` of a float truncates toward
zero (``int()`` here), ``math.Ceil`` is ``math.ceil``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from infra.charts import KEDA_APP_COMMIT as KEDA_COMMIT  # noqa: F401 (re-exported: the pin transcribed)
from infra.charts import KEDA_APP_TAG as KEDA_TAG  # noqa: F401 (re-exported: the pin transcribed)

DEFAULT_POLLING_INTERVAL_S = 30
"""``withtriggers_types.go`` ``defaultPollingInterval``."""
DEFAULT_MAX_REPLICA_COUNT = 100
"""``scaledjob_types.go`` ``defaultScaledJobMaxReplicaCount``."""
DEFAULT_MIN_REPLICA_COUNT = 0
"""``scaledjob_types.go`` ``defaultScaledJobMinReplicaCount``."""
REDIS_DEFAULT_LIST_LENGTH = 5
"""``redis_scaler.go`` ``listLength`` default: the target length per Job."""
REDIS_DEFAULT_ACTIVATION_LIST_LENGTH = 0
"""``redis_scaler.go`` ``activationListLength`` default."""

REDIS_SCALER_LUA = """
		local listName = KEYS[1]
		local listType = redis.call('type', listName).ok
		if listType == 'zset' then
			return redis.call('zcard', listName)
		elseif listType == 'set' then
			return redis.call('scard', listName)
		elseif listType == 'hash' then
			return redis.call('hlen', listName)
		elseif listType == 'list' or listType == 'none' then
			return redis.call('llen', listName)
		else
			return redis.error_reply('ERR unsupported key type: ' .. listType)
		end
	"""
"""``redis_scaler.go`` ``NewRedisScaler`` luaScript, byte for byte (Go raw string, tabs kept)."""


def redis_list_length(client, list_name: str) -> int:
    """What KEDA's Redis scaler reads for one trigger: ``EVAL luaScript 1 <listName>``
    (``createRedisScalerWithClient`` ``listLengthFn``) on a redis-py ``client``."""
    return int(client.eval(REDIS_SCALER_LUA, 1, list_name))


# -- the ScaledJob's counts (scaledjob_types.go) ----------------------------------------------

def min_replica_count(spec: dict) -> int:
    """``ScaledJob.MinReplicaCount()``."""
    lo, hi = spec.get("minReplicaCount"), spec.get("maxReplicaCount")
    if lo is not None:
        if hi is not None and lo > hi:
            return int(hi)
        return int(lo)
    return DEFAULT_MIN_REPLICA_COUNT


def max_replica_count(spec: dict) -> int:
    """``ScaledJob.MaxReplicaCount()``: note it is ``max - min`` when both are set."""
    lo, hi = spec.get("minReplicaCount"), spec.get("maxReplicaCount")
    if hi is not None:
        if lo is not None and lo > hi:
            return int(hi)
        return int(hi) - min_replica_count(spec)
    return DEFAULT_MAX_REPLICA_COUNT


def polling_interval_s(spec: dict) -> int:
    """``WithTriggers.GetPollingInterval()`` in seconds."""
    value = spec.get("pollingInterval")
    return int(value) if value is not None else DEFAULT_POLLING_INTERVAL_S


# -- metrics (pkg/scaling/scaledjob/metrics.go) -----------------------------------------------

@dataclass(frozen=True)
class ScalerMetrics:
    """``scaledjob.ScalerMetrics``: one trigger's reading."""

    queue_length: float
    max_value: float
    is_active: bool


def _get_max_value(max_value: float, max_replicas: int) -> float:
    return min(max_value, float(max_replicas))


def target_average_value(targets: Sequence[float | None]) -> float:
    """``getTargetAverageValue``: the mean of the metric specs' ``AverageValue`` (None counts 0)."""
    if not targets:
        return 0.0
    return sum(t or 0.0 for t in targets) / len(targets)


def calculate_queue_length_and_max_value(values: Iterable[float], targets: Sequence[float | None],
                                         max_replicas: int) -> tuple[float, float, float]:
    """``CalculateQueueLengthAndMaxValue``: (queueLength, maxValue, targetAverageValue) of one
    trigger whose metric values are ``values`` (a Redis trigger has one) and whose metric specs'
    targets are ``targets``."""
    queue_length = float(sum(values))
    target = target_average_value(targets)
    max_value = 0.0
    if target != 0:
        max_value = _get_max_value(queue_length / target, max_replicas)
    return queue_length, max_value, target


def is_scaled_job_active(metrics: Sequence[ScalerMetrics], calculation: str, min_replicas: int,
                         max_replicas: int) -> tuple[bool, int, int, float]:
    """``IsScaledJobActive``: (isActive, ceil(queueLength), ceil(maxValue), maxValue)."""
    queue_length = 0.0
    max_value = 0.0
    is_active = False
    if calculation == "min":
        for m in metrics:
            if (queue_length == 0 or m.queue_length < queue_length) and m.is_active:
                queue_length, max_value, is_active = m.queue_length, m.max_value, m.is_active
    elif calculation == "avg":
        ql_sum = mv_sum = 0.0
        length = 0
        for m in metrics:
            if m.is_active:
                ql_sum += m.queue_length
                mv_sum += m.max_value
                is_active = m.is_active
                length += 1
        if length:
            queue_length, max_value = ql_sum / length, mv_sum / length
    elif calculation == "sum":
        for m in metrics:
            if m.is_active:
                queue_length += m.queue_length
                max_value += m.max_value
                is_active = m.is_active
    else:  # "max", the default
        for m in metrics:
            if m.queue_length > queue_length and m.is_active:
                queue_length, max_value, is_active = m.queue_length, m.max_value, m.is_active
    if min_replicas > 0:
        is_active = True
    max_value = _get_max_value(max_value, max_replicas)
    return is_active, math.ceil(queue_length), math.ceil(max_value), max_value


# -- strategies (pkg/scaling/executor/scale_jobs.go) ------------------------------------------

STRATEGIES = ("default", "custom", "accurate", "eager")
"""``ScalingStrategy.Strategy`` enum (``+kubebuilder:validation:Enum=default;custom;accurate;eager``)."""


def select_strategy(scaling_strategy: dict) -> str:
    """``NewScalingStrategy``: which strategy runs (``custom`` falls back to ``default`` when
    ``customScalingRunningJobPercentage`` does not parse as a float, the empty string included)."""
    name = scaling_strategy.get("strategy", "")
    if name == "custom":
        try:
            float(scaling_strategy.get("customScalingRunningJobPercentage", ""))
        except ValueError:
            return "default"
        return "custom"
    return name if name in ("accurate", "eager") else "default"


def effective_max_scale(scaling_strategy: dict, max_scale: int, running: int, pending: int,
                        max_replicas: int, scale_to: int) -> tuple[int, int]:
    """``ScalingStrategy.GetEffectiveMaxScale`` of the strategy ``scaling_strategy`` selects:
    (effectiveMaxScale, scaleTo)."""
    strategy = select_strategy(scaling_strategy)
    if strategy == "custom":
        deduction = int(scaling_strategy.get("customScalingQueueLengthDeduction") or 0)
        percentage = float(scaling_strategy["customScalingRunningJobPercentage"])
        return min(max_scale - deduction - int(float(running) * percentage), max_replicas), scale_to
    if strategy == "accurate":
        if max_scale + running - pending > max_replicas:
            return max_replicas - running, scale_to
        return max_scale - pending, scale_to
    if strategy == "eager":
        return min(max_replicas - running - pending, max_scale), max_replicas
    return max_scale - running, scale_to


def scaling_decision(spec: dict, running: int, scale_to: int, max_scale: int, pending: int) -> tuple[int, int]:
    """``getScalingDecision``: (effectiveMaxScale, scaleTo) for a ScaledJob ``spec``."""
    lo = min_replica_count(spec)
    if running < lo:
        return lo - running, lo - running
    return effective_max_scale(spec.get("scalingStrategy") or {}, max_scale, running - lo, pending,
                               max_replica_count(spec), scale_to)


def jobs_to_create(spec: dict, *, is_active: bool, scale_to: int, max_scale: int, running: int,
                   pending: int) -> int:
    """``RequestJobScale`` then ``createJobs``: how many Jobs one polling cycle creates.
    ``scale_to``/``max_scale`` are ``getScaledJobState``'s queueLength/maxValue; ``running`` is
    ``getRunningJobCount`` (every unfinished Job), ``pending`` ``getPendingJobCount``."""
    effective, scale_to = scaling_decision(spec, running, scale_to, max_scale, pending)
    effective = max(effective, 0)
    if not is_active or effective <= 0:
        return 0
    return min(scale_to, effective)


# -- Job counts (scale_jobs.go) ---------------------------------------------------------------

@dataclass(frozen=True)
class PodView:
    """What KEDA reads of a Job's pod: its phase and the types of its conditions that are True."""

    phase: str
    """``Pending`` / ``Running`` / ``Succeeded`` / ``Failed`` / ``Unknown``."""
    true_conditions: frozenset[str] = frozenset()
    """e.g. ``{"PodScheduled", "Ready"}``."""


def job_is_pending(pods: Sequence[PodView], pending_pod_conditions: Sequence[str]) -> bool:
    """An unfinished Job counts as pending (``getPendingJobCount``) unless, with
    ``pendingPodConditions``, some pod has every listed condition True
    (``areAllPendingPodConditionsFulfilled``), or, without, some pod is Running or Succeeded
    (``isAnyPodRunningOrCompleted``)."""
    if pending_pod_conditions:
        required = set(pending_pod_conditions)
        return not any(len(required & pod.true_conditions) == len(pending_pod_conditions) for pod in pods)
    return not any(pod.phase in ("Succeeded", "Running") for pod in pods)


def redis_trigger_is_active(length: int, activation_list_length: int = REDIS_DEFAULT_ACTIVATION_LIST_LENGTH) -> bool:
    """``redisScaler.GetMetricsAndActivity``: active when the length exceeds ``activationListLength``."""
    return length > activation_list_length


def scaled_job_state(spec: dict, readings: Sequence[tuple[float, float | None, bool]]) -> tuple[bool, int, int]:
    """``getScaledJobState`` for triggers of one metric each: ``readings`` is, per trigger,
    (metric value, its target ``AverageValue``, the trigger's activity). Returns
    (isActive, queueLength, maxValue): ``RequestJobScale``'s isActive, scaleTo and maxScale."""
    hi = max_replica_count(spec)
    metrics = []
    for value, target, active in readings:
        queue_length, max_value, _ = calculate_queue_length_and_max_value([value], [target], hi)
        metrics.append(ScalerMetrics(queue_length, max_value, active))
    calculation = (spec.get("scalingStrategy") or {}).get("multipleScalersCalculation", "")
    is_active, queue_length, max_value, _ = is_scaled_job_active(metrics, calculation, min_replica_count(spec), hi)
    return is_active, queue_length, max_value
