"""A real ``redis-server`` on 127.0.0.1 for the local demo, the tests and the benchmark.

Never a fake: it starts the system ``redis-server`` binary (``apt-get install
redis-server``; CI installs it) on a free port with its data directory in a
temporary folder, optionally with AOF (``appendfsync always``), a password and
TLS, and stops it again. Nothing starts at import time.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class RedisServerError(RuntimeError):
    """The local redis-server could not be started."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_redis_server() -> str | None:
    """Path of the ``redis-server`` binary, or None when it is not installed."""
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(p)),
        None,
    )


@dataclass
class TlsFiles:
    """Certificate files for a TLS-only local server (self-signed CA)."""

    ca_cert: Path
    """CA certificate clients verify the server against."""
    server_cert: Path
    """Server certificate signed by the CA, valid for 127.0.0.1 and localhost."""
    server_key: Path
    """Private key of the server certificate."""


def make_tls_files(directory: Path) -> TlsFiles:
    """Create a throwaway CA and a server certificate for 127.0.0.1 with ``openssl``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ragpool-test-ca",
            "-keyout", str(ca_key), "-out", str(ca_cert))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return TlsFiles(ca_cert=ca_cert, server_cert=cert, server_key=key)


@dataclass
class LocalRedisServer:
    """One redis-server process bound to 127.0.0.1; ``start()``/``stop()``/``kill()``/``restart()``."""

    data_dir: Path | None = None
    """Working directory (AOF, RDB, log). A fresh temporary directory when None."""
    port: int = 0
    """TCP port; 0 picks a free one. Kept across restarts so clients can reconnect."""
    appendonly: bool = False
    """Enable AOF with ``appendfsync always`` so every acknowledged write survives SIGKILL."""
    password: str | None = None
    """``requirepass`` for the default user; None disables AUTH."""
    tls: TlsFiles | None = None
    """Serve TLS only (``port 0``, ``tls-port``) with these files when set."""
    extra_args: tuple[str, ...] = ()
    """More ``--name value`` arguments for redis-server."""
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        """Connection URL without credentials (pass the password separately)."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def _config_text(self) -> str:
        # A config file rather than argv, so the password never shows in `ps`.
        lines = [
            "bind 127.0.0.1",
            f"dir {self.data_dir}",
            'save ""',
            "daemonize no",
            "protected-mode yes",
            f"logfile {self.data_dir / 'redis.log'}",
        ]
        if self.tls:
            lines += [
                "port 0",
                f"tls-port {self.port}",
                f"tls-cert-file {self.tls.server_cert}",
                f"tls-key-file {self.tls.server_key}",
                f"tls-ca-cert-file {self.tls.ca_cert}",
                "tls-auth-clients no",
            ]
        else:
            lines.append(f"port {self.port}")
        if self.appendonly:
            lines += ["appendonly yes", "appendfsync always"]
        if self.password:
            lines.append(f"requirepass {self.password}")
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 10.0) -> "LocalRedisServer":
        binary = find_redis_server()
        if binary is None:
            raise RedisServerError(
                "redis-server is not installed: run `make sysdeps` (apt-get install redis-server)"
            )
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="ragpool-redis-"))
            self._owns_dir = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        conf = self.data_dir / "redis.conf"
        conf.write_text(self._config_text())
        conf.chmod(0o600)
        args = [binary, str(conf), *self.extra_args]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import redis

        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                log = self.data_dir / "redis.log" if self.data_dir else None
                tail = log.read_text()[-2000:] if log and log.exists() else ""
                raise RedisServerError(f"redis-server exited with {self.process.returncode}: {err}{tail}")
            try:
                client = self.client(socket_timeout=1.0)
                # LOADING replies are errors too: wait until the AOF is replayed.
                client.ping()
                client.close()
                return
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError) as exc:
                last_error = exc
                time.sleep(0.02)
        raise RedisServerError(f"redis-server on port {self.port} not ready after {timeout_s}s: {last_error}")

    def client(self, **kwargs):
        """A redis-py client for this server (decode_responses on)."""
        import redis

        options = dict(host="127.0.0.1", port=self.port, password=self.password, decode_responses=True)
        if self.tls:
            options.update(ssl=True, ssl_ca_certs=str(self.tls.ca_cert))
        options.update(kwargs)
        return redis.Redis(**options)

    def kill(self) -> None:
        """SIGKILL the server (a crash: only what reached the AOF survives)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart(self, timeout_s: float = 20.0) -> None:
        """Start again on the same port and data directory (replays the AOF)."""
        self.kill()
        self.start(timeout_s=timeout_s)

    def stop(self) -> None:
        """Stop the server and remove its temporary directory if this object created it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self._owns_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRedisServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
