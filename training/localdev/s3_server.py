"""A local S3 API on 127.0.0.1 (moto's threaded server, a dev dependency) for the data import tests and
``bench/import_throughput.py``: the real boto3 client, real HTTP, real ETags (multipart ``-N`` included)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from contract.paths import scoped_environ
from contract.ports import free_port

REGION = "us-west-2"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
"""What moto accepts; never real credentials."""


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def client(self, max_pool_connections: int = 16) -> Any:
        """A boto3 S3 client of this server."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", region_name=REGION, endpoint_url=self.endpoint,
                            config=Config(max_pool_connections=max_pool_connections), **CREDENTIALS)

    def env(self) -> dict[str, str]:
        """Environment under which a boto3 process (``python -m training.datasets.s3sync``) talks to this server."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_REGION": REGION,
                "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"]}


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's server on a free local port; stopped on exit."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@contextmanager
def s3_server_process(timeout_s: float = 60.0) -> Iterator[S3Server]:
    """moto's server in a process of its own (a benchmark: the client's CPU is not shared with the server's
    under one GIL, as with a real S3); stopped on exit."""
    import socket
    import subprocess
    import sys
    import time

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server on 127.0.0.1:{port} did not start within {timeout_s:.0f}s "
                                       f"(exit code {proc.poll()})") from None
                time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def s3_environment(server: S3Server) -> Iterator[None]:
    """This process's environment pointed at ``server`` (boto3 reads it), restored on exit."""
    with scoped_environ(server.env()):
        yield
