"""The run API on 127.0.0.1 in a thread of this process, for the tests, the benchmark and a local demo: the
real aiohttp server (training/api/server.py) on a free port, stopped on exit (:func:`run_api_server`), and the
whole local API the tests and ``make demo`` talk to (:func:`local_run_api`: its settings, a queue, identities
verified by a local STS, training/localdev/sts_server.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from contract.ports import free_port
from training.localdev.sts_server import REGION

START_TIMEOUT_S = 30.0
"""Longest the server may take to listen."""


@contextmanager
def run_api_server(api, *, host: str = "127.0.0.1", port: int | None = None, ssl_context=None) -> Iterator[str]:
    """Serve ``api`` (a ``training.api.server.RunApi``) on ``host:port`` (a free one by default; TLS with
    ``ssl_context``); yields its base URL."""
    from aiohttp import web

    from training.api.connections import ApiRunner

    port = port or free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failed: list[BaseException] = []
    runner_box: list = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            runner = ApiRunner(api.app(), access_log=None)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, host, port, ssl_context=ssl_context).start())
            runner_box.append(runner)
        except BaseException as exc:  # reported to the caller below
            failed.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:  # keep-alive connections' handlers
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=serve, name=f"run-api-{port}", daemon=True)
    thread.start()
    if not started.wait(START_TIMEOUT_S) or failed:
        raise RuntimeError(f"the run API on {host}:{port} did not start within {START_TIMEOUT_S:.0f}s: {failed}")
    try:
        yield f"{'https' if ssl_context else 'http'}://{host}:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(START_TIMEOUT_S)


@contextmanager
def local_run_api(queue, *, sts_endpoint: str, cluster_id: str, teams: dict, shared_root: str,
                  region: str = REGION, team_queues: dict | None = None, audit_stream=None) -> Iterator[tuple]:
    """The run API (``training.api.server.RunApi``) on ``queue`` (a ``TaskQueue``), served by
    :func:`run_api_server`; yields ``(endpoint URL, RunApi)``.

    Tokens must be signed for ``cluster_id`` and presigned for ``sts_endpoint`` (a local STS:
    ``training.localdev.sts_server.sts_server``); ``teams`` is the stack's ``apiTeams`` mapping
    (``{"teams": {team: [ARN pattern]}, "admins": [...]}``); ``shared_root`` the storage submit checks;
    ``team_queues`` the ``ApiSettings.team_queues``; ``audit_stream`` where the audit lines go (None: stdout)."""
    from contract.api import parse_api_teams
    from training.api.server import RunApi
    from training.api.settings import ApiSettings

    settings = ApiSettings(cluster_id=cluster_id, sts_endpoint=sts_endpoint, teams=parse_api_teams(teams),
                           shared_root=shared_root, region=region, team_queues=team_queues or {})
    api = RunApi(settings, queue, audit_stream=audit_stream)
    with run_api_server(api) as endpoint:
        yield endpoint, api
