"""What KEDA's Redis scaler runs against Redis for one trigger, transcribed from its source.

Source: kedacore/keda, tag v2.20.2 (commit 68a5b5028f35b22d50597c69819ab32c4e92f21a),
``pkg/scalers/redis_scaler.go``, ``NewRedisScaler``: the scaler (plain, Sentinel and cluster
clients alike) sends ``EVAL <script> 1 <listName>`` and uses the integer reply as the metric
(``GetMetricsAndActivity``: the value, and active when it is > ``activationListLength``). The
script picks the count by the key's TYPE: ZCARD for a zset, SCARD for a set, HLEN for a hash,
LLEN for a list or a missing key (0), an error for any other type. Our ready lists are lists,
so the count is their LLEN; a lane's trigger list sums them (one trigger per priority).
"""

from __future__ import annotations

KEDA_TAG = "v2.20.2"
KEDA_COMMIT = "68a5b5028f35b22d50597c69819ab32c4e92f21a"

# Verbatim from NewRedisScaler (luaScript), kedacore/keda v2.20.2 pkg/scalers/redis_scaler.go.
LIST_LENGTH_SCRIPT = """
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


def list_length(client, list_name: str) -> int:
    """The metric of one Redis trigger with ``listName: list_name`` (exactly the scaler's command)."""
    return int(client.eval(LIST_LENGTH_SCRIPT, 1, list_name))


def lane_metric(client, list_names: list[str], activation_list_length: int = 0) -> int:
    """A ScaledJob's queue length over several Redis triggers with
    ``scalingStrategy.multipleScalersCalculation: sum``: the sum of the metrics of the ACTIVE
    triggers (metric > ``activationListLength``, default 0), as ``IsScaledJobActive`` in
    kedacore/keda v2.20.2 ``pkg/scaling/scaledjob/metrics.go`` computes it."""
    lengths = [list_length(client, name) for name in list_names]
    return sum(n for n in lengths if n > activation_list_length)
