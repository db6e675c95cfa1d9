"""The run API on 127.0.0.1 in a thread of this process, for the tests, the benchmark and a local demo: the
real aiohttp server (training/api/server.py) on a free port, stopped on exit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from contract.ports import free_port

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
