"""training/api/connections.py: a client that sends its request line and headers too slowly is closed (slowloris),
against the real server (``local_api``: training/localdev/run_api.py serves it through ``ApiRunner``)."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def _slow_headers(endpoint: str, pieces: list[bytes], every_s: float, bound_s: float) -> tuple[bytes, float]:
    """Send ``pieces`` of a request's headers ``every_s`` apart on a raw socket; (what came back, seconds until the
    server closed the connection, or ``bound_s`` when it did not)."""
    import socket
    import time

    parts = urlsplit(endpoint)
    started = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=bound_s) as sock:
        got = b""
        for piece in pieces:
            try:
                sock.sendall(piece)
            except OSError:  # closed under us: what we wanted to see
                break
            sock.settimeout(every_s)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            got += chunk
            if not chunk:
                break
        else:
            sock.settimeout(max(0.1, bound_s - (time.monotonic() - started)))
            try:
                while chunk := sock.recv(65536):
                    got += chunk
            except TimeoutError:
                return got, bound_s
            except OSError:
                pass
    return got, time.monotonic() - started


def test_a_client_that_sends_its_headers_slowly_is_closed(local_api, monkeypatch):
    """Slowloris: the request line and headers must be whole within HEADER_TIMEOUT_S of the connection (or of the
    next request's first byte on a kept-alive one); the connection is then closed without an answer, and the
    server still answers everyone else."""
    from training.api import connections

    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 1.0)
    drip = [b"GET /healthz HTTP/1.1\r\n", *(f"X-Slow-{i}: {i}\r\n".encode() for i in range(20)), b"\r\n"]
    got, took = _slow_headers(local_api.endpoint, drip, every_s=0.25, bound_s=6.0)
    assert got == b"" and took < 3.0, (got[:200], took)
    # a whole request in time is answered, and a kept-alive connection's next slow request is closed the same way
    fast = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", *drip]
    got, took = _slow_headers(local_api.endpoint, fast, every_s=0.25, bound_s=6.0)
    assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1") == 1 and took < 3.0, (got[:300], took)
    parts = urlsplit(local_api.endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
