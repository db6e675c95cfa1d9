"""How a ``ragpool`` run command reaches the runs, and what it says when it cannot.

With a context (``ragpool login``, training/api/contexts.py) and no ``REDIS_URL``: through the run API
(:func:`remote_client`); else on Redis directly (:func:`with_queue`: no pool configured is exit 2, every
Redis-side failure exit 4 in one line naming the endpoint, never a password). :func:`run_verb` runs one verb
(training/scheduler/verbs.py) either way and shows its outcome; :func:`follow_run` polls a run to its end.
The commands themselves are in ``cli.py`` (``ragpool logs`` and ``report`` use this too).
"""

from __future__ import annotations

import json
import sys
import time

from contract import exit_codes
from contract.env import REDIS_URL_ENV
from training.scheduler import verbs
from training.scheduler.verbs import Unconfirmed


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def with_queue(command: str, fn):
    """Run ``fn(queue)`` on the queue from the environment. Bad connection settings are exit 2;
    every Redis-side failure (unreachable, dropped mid-command, timeout, ``LOADING``,
    ``READONLY`` after a failover, refused credentials, a write the required replicas did not
    confirm...) is exit 4 with one line that names the endpoint, never the password; when
    ``fn`` raised :class:`Unconfirmed`, the line says the write could not be confirmed (it may
    or may not exist) and how to repeat it."""
    import redis

    from training.scheduler.redis_conn import RedisConfigError, configured, settings_from_env
    from training.scheduler.run_queue import namespace_from_env, open_queue

    if not configured():  # never a silent 127.0.0.1
        print(f"ragpool {command}: where is the pool? No context is active and {REDIS_URL_ENV} is not set: run "
              f"`ragpool login --stack NAME` (or --cluster NAME), or set {REDIS_URL_ENV}=redis://HOST:PORT/0",
              file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        settings = settings_from_env()
    except RedisConfigError as exc:
        print(f"ragpool {command}: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        queue = open_queue(settings, namespace=namespace_from_env())
        queue.client.ping()
        return fn(queue)
    except (redis.RedisError, Unconfirmed) as error:
        return _redis_failure(command, settings, error)


def _redis_failure(command: str, settings, error: Exception) -> int:
    """Say why Redis failed ``command`` in one line naming the endpoint, never a password: exit 4."""
    import redis

    from training.scheduler.redis_conn import NotReplicatedError

    exc = error.cause if isinstance(error, Unconfirmed) else error
    if isinstance(exc, NotReplicatedError):
        why = (f"{exc.confirmed} of the {exc.required} required replica(s) had it within "
               f"{exc.wait_ms} ms (REDIS_REQUIRED_REPLICAS, REDIS_REPLICA_WAIT_MS)")
    elif isinstance(exc, redis.AuthenticationError):
        why = f"refused the credentials ({type(exc).__name__})"
    elif isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        why = f"cannot reach Redis ({type(exc).__name__}: {exc})"
    else:
        why = f"Redis failed the command ({type(exc).__name__}: {exc})"
    why = _one_line(why)
    for secret in (settings.password, settings.sentinel_password):
        if secret:
            why = why.replace(secret, "***")
    if isinstance(error, Unconfirmed):
        print(f"ragpool {command}: {error.what} could not be confirmed at {settings.endpoint}: {why}; "
              f"it may or may not have been recorded: {error.retry_hint}", file=sys.stderr)
    else:
        print(f"ragpool {command}: {why} at {settings.endpoint}; try again later", file=sys.stderr)
    return exit_codes.UNAVAILABLE


FOLLOW_POLL_S = 1.0
"""How often ``submit --wait`` and ``logs -f`` read the run's state."""


def with_status(command: str, fn) -> int:
    """``fn(read)``, where ``read(run_id)`` is that run's status :class:`~training.scheduler.verbs.Outcome`
    through the run API when a context is active, else from the queue (:func:`with_queue`: no pool configured is
    exit 2, Redis failing exit 4)."""
    client, code = remote_client(command)
    if code is not None:
        return code
    if client is not None:
        return fn(client.status)
    return with_queue(command, lambda queue: fn(lambda run_id: verbs.status(queue, run_id)))


def follow_run(command: str, run_id: str, *, timeout_s: float | None = None, step=None) -> int:
    """Poll ``run_id``'s state (:func:`with_status`) until it has ended, then return its exit code
    (``verbs.exit_of_end``: 0 succeeded, 1 dead or cancelled). ``step(state)`` runs at each poll and ends the
    wait by returning an exit code. Bounded: after ``timeout_s`` it says what it waited for and returns 75
    (``exit_codes.RETRIABLE``: the run goes on; wait again). An unknown run is 3."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def loop(read) -> int:
        while True:
            outcome = read(run_id)
            if not outcome.ok:
                print(f"ragpool {command}: {outcome.message}", file=sys.stderr)
                return outcome.code
            state = outcome.data["state"]
            if step is not None and (code := step(state)) is not None:
                return code
            end = verbs.exit_of_end(state)
            if end is not None:
                return end
            if deadline is not None and time.monotonic() >= deadline:
                print(f"ragpool {command}: stopped waiting for run {run_id} to end after {timeout_s:g}s; it is "
                      f"{state} (exit {exit_codes.RETRIABLE}: wait again)", file=sys.stderr)
                return exit_codes.RETRIABLE
            time.sleep(FOLLOW_POLL_S)

    return with_status(command, loop)


def _remote():
    """The run API client of the active context (``ragpool login``), or None for the direct path (``REDIS_URL``
    set, or no context); a broken context file raises ``ContextError``."""
    from training.api.client import remote_from_env

    return remote_from_env()


def remote_client(command: str):
    """``(client, None)``: the run API client of the active context, or None for the direct path (:func:`_remote`);
    ``(None, 2)`` once a broken context file is said on stderr (``ragpool <command>: ...``): every command that may
    go through the API starts with it."""
    from training.api.contexts import ContextError

    try:
        return _remote(), None
    except ContextError as exc:
        print(f"ragpool {command}: {exc}", file=sys.stderr)
        return None, exit_codes.BAD_INPUT


def run_verb(command: str, local, remote_call, render=None, *, json_out: bool = False) -> int:
    """Run a verb through the run API (``remote_call(client)``) when a context is active, else on the queue
    (``local(queue)``), both an :class:`~training.scheduler.verbs.Outcome`; show it and return its exit code:
    ``data`` as JSON with ``json_out``, else ``render(data)`` or its message (stdout), a failure on stderr."""
    client, code = remote_client(command)
    if code is not None:
        return code
    if client is not None:
        outcome = remote_call(client)
    else:
        holder: list = []

        def run(queue) -> int:
            holder.append(local(queue))
            return holder[0].code

        code = with_queue(command, run)
        if not holder:
            return code
        outcome = holder[0]
    if not outcome.ok:
        print(f"ragpool {command}: {outcome.message}", file=sys.stderr)
    elif json_out:
        print(json.dumps(outcome.data, indent=2))
    elif render is not None:
        print(render(outcome.data))
    elif outcome.message:
        print(outcome.message)
    return outcome.code
