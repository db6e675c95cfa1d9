"""A real ``redis-server`` on 127.0.0.1 for the local demo, the tests and the benchmark.

Never a fake: it starts the system ``redis-server`` binary (``apt-get install
redis-server``; CI installs it) on a free port with its data directory in a
temporary folder, optionally with AOF (``appendfsync always``), a password and
TLS, and stops it again. Nothing starts at import time.

:class:`LocalSentinelGroup` adds a primary + replica(s) + ``redis-sentinel``
processes on 127.0.0.1 (``apt-get install redis-sentinel``) for failover tests:
``failover()`` asks the Sentinels to promote a replica, ``kill_primary()``
SIGKILLs the current primary, and ``env()`` gives the ``REDIS_SENTINELS`` /
``REDIS_SENTINEL_MASTER`` a client needs to follow the primary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.ports import free_port


class RedisServerError(RuntimeError):
    """The local redis-server could not be started."""


def find_redis_sentinel() -> str | None:
    """Path of the ``redis-sentinel`` binary (Debian package ``redis-sentinel``), or None."""
    return shutil.which("redis-sentinel") or next(
        (p for p in ("/usr/bin/redis-sentinel", "/usr/local/bin/redis-sentinel") if os.path.exists(p)),
        None,
    )


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
    replica_of: int | None = None
    """Start as a replica of the server on this 127.0.0.1 port (``replicaof``)."""
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
            # masterauth too: after a failover this server may replicate from a peer.
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        if self.replica_of:
            lines.append(f"replicaof 127.0.0.1 {self.replica_of}")
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
        stop_process(self.process)
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self._owns_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRedisServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_process(process: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """SIGTERM a local server we started, SIGKILL it if it is still there after ``timeout_s``."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)


@dataclass
class LocalSentinelGroup:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels, all on 127.0.0.1.

    Short timeouts (``down_after_ms``, ``failover_timeout_ms``) make a failover take
    seconds. Every process gets its own free port and a folder under ``data_dir``.
    """

    data_dir: Path
    master_name: str = "ragpool"
    replicas: int = 1
    sentinels: int = 3
    password: str | None = None
    appendonly: bool = True
    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000
    nodes: list[LocalRedisServer] = field(default_factory=list, init=False)
    sentinel_ports: list[int] = field(default_factory=list, init=False)
    _sentinel_procs: list[subprocess.Popen] = field(default_factory=list, init=False, repr=False)

    @property
    def quorum(self) -> int:
        return self.sentinels // 2 + 1

    def start(self, timeout_s: float = 20.0) -> "LocalSentinelGroup":
        binary = find_redis_sentinel()
        if binary is None:
            raise RedisServerError("redis-sentinel is not installed: run `make sysdeps` (apt-get install redis-sentinel)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A full resync starts at once (the default waits 5 s for more replicas to join).
        fast_sync = ("--repl-diskless-sync-delay", "0")
        primary = LocalRedisServer(data_dir=self.data_dir / "node-0", appendonly=self.appendonly,
                                   password=self.password, extra_args=fast_sync).start()
        self.nodes = [primary]
        for i in range(self.replicas):
            self.nodes.append(LocalRedisServer(data_dir=self.data_dir / f"node-{i + 1}", appendonly=self.appendonly,
                                               password=self.password, replica_of=primary.port,
                                               extra_args=fast_sync).start())
        self._wait(lambda: self._replicas_online(primary) >= self.replicas, timeout_s, "replicas in sync")
        for i in range(self.sentinels):
            port = free_port()
            folder = self.data_dir / f"sentinel-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            conf = folder / "sentinel.conf"  # Sentinel rewrites it: it must be writable
            lines = [
                "bind 127.0.0.1", f"port {port}", f"dir {folder}", "daemonize no",
                f"logfile {folder / 'sentinel.log'}",
                f"sentinel monitor {self.master_name} 127.0.0.1 {primary.port} {self.quorum}",
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
                f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.master_name} 1",
            ]
            if self.password:
                lines.append(f"sentinel auth-pass {self.master_name} {self.password}")
            conf.write_text("\n".join(lines) + "\n")
            conf.chmod(0o600)
            self._sentinel_procs.append(subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL,
                                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.sentinel_ports.append(port)
        # Ready: every Sentinel knows the replicas and the other Sentinels (failover needs both).
        self._wait(self._sentinels_ready, timeout_s, "sentinels discovering each other")
        return self

    def _replicas_online(self, node: LocalRedisServer) -> int:
        client = node.client(socket_timeout=1.0)
        try:
            info = client.info("replication")
        finally:
            client.close()
        return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                   and v.get("state") == "online")

    def sentinel_client(self, index: int = 0):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index], decode_responses=True,
                           socket_timeout=2.0)

    def _sentinels_ready(self) -> bool:
        for port_index in range(len(self.sentinel_ports)):
            client = self.sentinel_client(port_index)
            try:
                master = client.sentinel_master(self.master_name)
            finally:
                client.close()
            if (int(master.get("num-other-sentinels", 0)) < self.sentinels - 1
                    or int(master.get("num-slaves", 0)) < self.replicas):
                return False
        return True

    @staticmethod
    def _wait(predicate, timeout_s: float, what: str) -> None:
        import redis

        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except (redis.RedisError, OSError) as exc:
                last = exc
            time.sleep(0.05)
        raise RedisServerError(f"timed out after {timeout_s}s waiting for {what}" + (f": {last}" if last else ""))

    def primary_port(self) -> int:
        """The primary's port as the Sentinels see it (the first that answers)."""
        import redis

        for i in range(len(self.sentinel_ports)):
            client = self.sentinel_client(i)
            try:
                _host, port = client.sentinel_get_master_addr_by_name(self.master_name)
                return int(port)
            except (redis.RedisError, OSError, TypeError):
                continue
            finally:
                client.close()
        raise RedisServerError("no Sentinel answers")

    def node(self, port: int) -> LocalRedisServer:
        return next(n for n in self.nodes if n.port == port)

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: promote a replica (the old primary becomes its replica)."""
        client = self.sentinel_client()
        try:
            client.execute_command("SENTINEL", "FAILOVER", self.master_name)
        finally:
            client.close()

    def kill_primary(self) -> LocalRedisServer:
        """SIGKILL the current primary; returns it (``restart()`` brings it back as a replica)."""
        node = self.node(self.primary_port())
        node.kill()
        return node

    def wait_replicas_online(self, count: int = 1, timeout_s: float = 30.0) -> None:
        """Wait until the current primary has ``count`` replicas in sync."""
        self._wait(lambda: self._replicas_online(self.node(self.primary_port())) >= count, timeout_s,
                   f"{count} replica(s) online")

    def restart_as_replica(self, node: LocalRedisServer) -> None:
        """Bring a killed node back as a replica of the current primary (as an operator would)."""
        node.replica_of = self.primary_port()
        node.start()

    def wait_primary_change(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Wait until the Sentinels name a new primary that answers as one; returns its port."""
        def changed() -> bool:
            port = self.primary_port()
            if port == old_port:
                return False
            client = self.node(port).client(socket_timeout=1.0)
            try:
                return client.info("replication").get("role") == "master"
            finally:
                client.close()

        self._wait(changed, timeout_s, f"a new primary (old: {old_port})")
        return self.primary_port()

    def env(self) -> dict[str, str]:
        """Environment for ``training.scheduler.redis_conn`` clients that follow the primary."""
        env = {"REDIS_SENTINELS": ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports),
               "REDIS_SENTINEL_MASTER": self.master_name}
        if self.password:
            env["REDIS_PASSWORD"] = self.password
        return env

    def stop(self) -> None:
        for process in self._sentinel_procs:
            stop_process(process)
        self._sentinel_procs.clear()
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "LocalSentinelGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
