"""The defaults both sides use: the worker and keeper run with them, the Pulumi program derives from them."""

DEFAULT_LEASE_S = 60.0
"""A claim's lease: a worker silent this long loses its run to the next claimer (the worker's ``--lease-seconds``)."""
DEFAULT_BACKOFF_BASE_S = 30.0
"""First retry delay after a failed attempt; doubles each attempt (``--backoff-base-seconds``)."""
DEFAULT_BACKOFF_MAX_S = 3600.0
"""Upper bound of the retry delay (``--backoff-max-seconds``)."""
KEEPER_INTERVAL_S = 5.0
"""Seconds between two ticks of the queue keeper (``--interval-seconds``)."""
DEFAULT_GANG_DEADLINE_S = 900.0
"""How long a gang waits for all its pods (``RAGPOOL_GANG_DEADLINE_SECONDS``): longer than a GPU node takes to
come up."""
ELASTIC_MAX_RESTARTS = 10
"""An elastic run's budget of lost nodes in one attempt (torchrun ``--max-restarts`` of ``training.elastic.launch``):
torch spends one per failed worker group, none when a node joins; spent, the attempt fails and the queue retries."""
