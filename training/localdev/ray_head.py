"""A real local Ray head with the Jobs API for the local demo and the tests (no cloud, no fake).

    head = LocalRayHead(num_cpus=2, pool="gpu-spot").start()
    head.address       # http://127.0.0.1:<dashboard port>: RAY_ADDRESS of a queue worker (Jobs API)
    head.gcs_address   # 127.0.0.1:<gcs port>: RAY_ADDRESS of a Ray driver (ray.init), e.g. ragpool tune
    head.client_env()  # RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH=<its token file>: what a client needs
    head.stop()

It runs ``ray start --head --block`` in its own session on free ports (GCS, dashboard, dashboard
agent, Ray client server), with ``--num-cpus`` logical CPUs, a small object store, and the Ray node
label ``ragpool.io/pool=<pool>`` (:data:`training.ray.placement.POOL_LABEL`): the local node stands
in for a GPU pool of a real cluster (its GPUs are logical too: ``num_gpus``, 0 by default), so a ray
run's stages name that pool as they would on KubeRay. Its temp dir is short and under /tmp (Ray's AF_UNIX socket paths must
stay under 108 bytes). It runs with Ray's token authentication, as every ragpool RayCluster does
(:mod:`contract.ray_auth`): a fresh random token in a file of its temp dir (mode 0600), which
:meth:`LocalRayHead.client_env` hands to its clients, so the authenticated path is the one the demo
and the tests exercise (``auth=False`` runs it without). Every Ray process it starts (raylet, workers,
the Ray jobs' drivers) inherits ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``, the repository on
``PYTHONPATH``, this interpreter's directory first on
``PATH`` (a Ray job's ``python -m ...`` entrypoint runs this virtualenv's Python), Ray Train's
PreemptionWatcher turned off (one local node is never preempted), ``RAY_API_SERVER_ADDRESS`` naming its dashboard
(a State API lookup inside it never meets another Ray on the machine: :data:`API_SERVER_ENV`) and a marker
variable naming the temp dir, by which :meth:`LocalRayHead.stop` finds and ends exactly this head's
processes, even those that left its session, and no other Ray on the machine (never ``ray stop``,
which stops every Ray of the user). Nothing starts at import time.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from contract.ports import free_ports

MARKER_ENV = "RAGPOOL_LOCAL_RAY_HEAD"
"""Set to the head's temp dir in every process of the head (how :meth:`LocalRayHead.stop` finds them)."""


TOKEN_FILE = "auth_token"
"""The head's token file in its temp dir (``RAY_AUTH_TOKEN_PATH`` of the head and its clients)."""

PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
"""Ray Train's switch for its per-run PreemptionWatcher actor (ray.train.v2 constants; on by default)."""

API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
"""The dashboard a State API or Jobs client with no address asks (Ray 2.58 ``dashboard/utils.py``
``get_address_for_submission_client``). Unset, the client looks for the raylets on the machine and, with two
clusters there, raises "Found multiple active Ray instances": Ray Train's placement-group cleaner asks that way
whether its controller lives, so its thread ends and the placement group of a trial Tune stops is never removed.
Every process of a local cluster gets its own dashboard here (on a KubeRay pod one cluster is all there is)."""

USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"
"""Ray's usage-stats report (``0``: off; a local head has nobody to report to and no internet)."""

METRICS_COLLECTION_ENV = "RAY_enable_metrics_collection"
"""Ray's system config ``enable_metrics_collection`` (``0``: off). A local head has no Prometheus scraping it, and
every Ray node's raylet, GCS and agents then stop recording and exporting metrics: measured on the 2-core machine,
an idle one-node local Ray took 3.1 CPU-s per 30 s instead of 5.1."""


PORT_ATTEMPTS = 3
"""How many times :meth:`LocalRayHead.start` starts a head whose chosen port was taken before it bound it."""


class RayHeadError(RuntimeError):
    """The local Ray head could not be started (the message carries the end of its log)."""


def find_ray() -> str | None:
    """The ``ray`` CLI of this interpreter's environment (the ``ray`` extra), or None."""
    beside = Path(sys.executable).with_name("ray")
    if beside.is_file():
        return str(beside)
    return shutil.which("ray")


@dataclass
class LocalRayHead:
    """One single-node Ray cluster on 127.0.0.1 with the dashboard (Jobs API); ``start()``/``stop()``."""

    num_cpus: int = 2
    """Logical CPUs of the node (what Ray schedules against; not a limit on threads)."""
    num_gpus: int = 0
    """Logical GPUs (0 on a CPU machine)."""
    pool: str = "gpu-spot"
    """The pool the node stands in for (Ray node label ``ragpool.io/pool``); empty = no label."""
    object_store_mb: int = 256
    """Object store size: the Ray executor passes small results and paths, bulk data stays on disk."""
    env: dict[str, str] = field(default_factory=dict)
    """More variables for every process of the head."""
    auth: bool = True
    """Ray token authentication (``RAY_AUTH_MODE=token``, a random token); False: ``disabled``."""
    temp_dir: Path | None = None
    """Ray's temp dir; a fresh short one under /tmp when None (removed by ``stop()``)."""
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    dashboard_port: int = field(default=0, init=False)
    gcs_port: int = field(default=0, init=False)
    _agent_port: int = field(default=0, init=False, repr=False)
    _client_port: int = field(default=0, init=False, repr=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)

    @property
    def address(self) -> str:
        """The Jobs API (dashboard): ``RAY_ADDRESS`` of ``python -m training.ray.job``."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        """The cluster address a Ray driver joins (``ray.init(address=...)``)."""
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def log_path(self) -> Path:
        assert self.temp_dir is not None
        return self.temp_dir / "ray-start.log"

    @property
    def token_path(self) -> Path:
        """The file holding the head's token, in its temp dir (written by :meth:`launch`)."""
        return Path(str(self.temp_dir)) / TOKEN_FILE

    def client_env(self) -> dict[str, str]:
        """What a client of this head (a queue worker, ``ray.init``, the ray CLI) needs in its environment."""
        from contract.ray_auth import AUTH_MODE_ENV, client_env

        return client_env(self.token_path) if self.auth else {AUTH_MODE_ENV: "disabled"}

    def auth_headers(self) -> dict[str, str]:
        """The HTTP header that authenticates a request to this head's dashboard / Jobs API."""
        from contract.ray_auth import auth_headers

        return auth_headers(self.client_env())

    def process_env(self) -> dict[str, str]:
        """The environment ``ray start`` and so every Ray process of this head runs with."""
        from contract.paths import child_env

        from contract.ray_auth import TOKEN_ENV

        env = child_env()
        env.pop("RAY_ADDRESS", None)  # this is a new cluster, not a client of another one
        env.pop(TOKEN_ENV, None)  # its token is its own file's
        env.update({USAGE_STATS_ENV: "0", METRICS_COLLECTION_ENV: "0", "HF_HUB_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"})
        env.update(self.client_env())
        # Ray Train starts a PreemptionWatcher actor per training run to report which node a spot
        # interruption took (observability only); one local node is never preempted, and on 2 cores
        # each such process costs ~3.5 CPU-seconds of Ray imports per training run or Tune trial.
        env[PREEMPTION_WATCHER_ENV] = "0"
        env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH")) if p)
        env[API_SERVER_ENV] = self.address
        env.update(self.env)
        env[MARKER_ENV] = str(self.temp_dir)
        return env

    def command(self, ray: str) -> list[str]:
        from contract.names import POOL_LABEL

        cmd = [ray, "start", "--head", "--block", "--disable-usage-stats",
               f"--port={self.gcs_port}",
               "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
               f"--dashboard-agent-listen-port={self._agent_port}", f"--ray-client-server-port={self._client_port}",
               f"--num-cpus={self.num_cpus}", f"--num-gpus={self.num_gpus}",
               f"--object-store-memory={self.object_store_mb * 1024 * 1024}", f"--temp-dir={self.temp_dir}"]
        if self.pool:
            cmd.append(f"--labels={POOL_LABEL}={self.pool}")
        return cmd

    def start(self, timeout_s: float = 180.0) -> "LocalRayHead":
        """:meth:`launch`, then :meth:`wait_ready`. Ports are chosen free but bound only later by ``ray start``; when
        another process took one in between ("address already in use" in the head's log), the head is started
        again on fresh ports, at most ``PORT_ATTEMPTS`` times; any other failure is raised at once."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self.launch().wait_ready(timeout_s)
            except RayHeadError as exc:
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    def launch(self) -> "LocalRayHead":
        """Start ``ray start --head`` and return at once (the head comes up while the caller works on);
        :meth:`wait_ready` before using it. RayHeadError when the ray CLI is missing."""
        ray = find_ray()
        if ray is None:
            raise RayHeadError("the ray CLI is not installed: install the ray extra (pip install -e '.[ray]')")
        if self.temp_dir is None:
            self.temp_dir = Path(tempfile.mkdtemp(prefix="rgd", dir="/tmp"))
            self._owns_dir = True
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        if self.auth:
            # Ray's own generator's size (256 bits); the file only its owner can read.
            fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
        self.gcs_port, self.dashboard_port, self._agent_port, self._client_port = free_ports(4)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(ray), env=self.process_env(), stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            cwd=str(self.temp_dir))
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> "LocalRayHead":
        """Until the launched head's Jobs API answers; on failure (RayHeadError) the head is stopped."""
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the Jobs API answers a job listing and the node is up (``/api/jobs/`` and ``/nodes``)."""
        deadline = time.monotonic() + timeout_s
        last: Exception | str | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RayHeadError(f"ray start exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                headers = self.auth_headers()
                with urllib.request.urlopen(urllib.request.Request(f"{self.address}/api/jobs/", headers=headers),
                                            timeout=5) as reply:
                    json.loads(reply.read() or b"[]")
                with urllib.request.urlopen(urllib.request.Request(f"{self.address}/nodes?view=summary",
                                                                   headers=headers), timeout=5) as reply:
                    nodes = json.loads(reply.read()).get("data", {}).get("summary", [])
                if nodes:
                    return
                last = "no node registered yet"
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = exc
            time.sleep(0.5)
        raise RayHeadError(f"the Ray head's Jobs API at {self.address} did not answer within {timeout_s:.0f}s "
                           f"({last}):\n{self.log_tail()}")

    def pids(self) -> list[int]:
        """Processes that carry this head's marker (its Ray processes, wherever their session went)."""
        if self.temp_dir is None:
            return []
        marker = b"\0" + f"{MARKER_ENV}={self.temp_dir}".encode() + b"\0"
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if marker in b"\0" + fh.read() + b"\0":
                        pids.append(int(entry))
            except OSError:  # gone, or another user's
                continue
        return pids

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the head and every process of it, then remove its temp dir (if this object made it)."""
        process = self.process
        if process is not None and process.poll() is None:
            # ray start --block shuts its processes down on SIGTERM.
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the session it led: ours alone
            except (ProcessLookupError, PermissionError):
                pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:  # processes that left its session (a Ray job's driver runs in its own)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.1)
        self.process = None
        if self._owns_dir and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRayHead":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
