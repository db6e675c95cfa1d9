"""The run API's connections (training/api/server.py): aiohttp's, plus a deadline on each request's line and headers
against slow clients (slowloris), which aiohttp does not bound (only the body's size and an idle keep-alive), and
the runner that serves the application with it (in its pod, and in-process for tests: training/localdev/run_api.py).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web, web_protocol

HEADER_TIMEOUT_S = 10.0
"""Longest a client may take to send a request's line and headers, from its connection (or from the first byte of
its next request on a kept-alive connection): a slower one is closed without an answer (:class:`HeaderDeadline`)."""

log = logging.getLogger("ragpool.api")


class HeaderDeadline(web_protocol.RequestHandler):
    """aiohttp's connection handler, plus a deadline on each request's line and headers (:data:`HEADER_TIMEOUT_S`):
    armed when the connection opens and when the first byte of a next request arrives (no request parsed and none
    being handled), disarmed once the parser has a whole request; when it passes, the connection is closed."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self._current_request is None and not self._messages:
            self._arm()  # the start of the next request's headers
        super().data_received(data)
        if self._messages:
            self._disarm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = self._loop.call_later(HEADER_TIMEOUT_S, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._current_request is None and not self._messages:
            log.info("closed a connection from %s: no whole request line and headers within %.0fs",
                     self.peername, HEADER_TIMEOUT_S)
            self.force_close()


class _HeaderDeadlineServer(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return HeaderDeadline(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are :class:`HeaderDeadline`'s (aiohttp takes no handler class)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _HeaderDeadlineServer(server.request_handler, request_factory=server.request_factory,
                                     handler_cancellation=server.handler_cancellation, loop=server._loop,
                                     **server._kwargs)


def serve(app: web.Application, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT (as ``web.run_app``, through :class:`ApiRunner`), then clean up."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    runner = ApiRunner(app, access_log=None, handle_signals=True)
    try:
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, host, port).start())
        loop.run_forever()
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()
