"""promtool and a real ``prometheus`` on 127.0.0.1 for the dashboards tests.

prometheus runs with a temp config and data dir on a free port, with readiness and query
helpers over its HTTP API, and is always stopped when the ``with`` block ends."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from dashboards import rulefiles
from tests.support.waits import wait_for
from training.localdev.redis_server import stop_process
from contract.ports import free_port


def run_promtool(promtool: str, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool, capturing output (never raises on a non-zero exit)."""
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


# What a probe of a server that is not up (OSError) or not ready (ValueError) yet raises.
NOT_READY = (OSError, ValueError)


def write_rules_with_stall_window(out_dir: Path, threshold_s: int, for_s: int) -> list[Path]:
    """Copy the real rule files to ``out_dir``, shrinking only RagpoolTrainingStalled's
    staleness threshold (900 s) and ``for`` (5m) to test-sized values; the rest of its
    expression, labels and annotations stay as shipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    changed = 0
    for path in rulefiles.rule_files():
        groups = rulefiles.load_groups(path)
        for group in groups:
            for rule in group["rules"]:
                if rule.get("alert") == "RagpoolTrainingStalled":
                    assert rule["expr"].count("> 900") == 1, "RagpoolTrainingStalled threshold moved; update the harness"
                    rule["expr"] = rule["expr"].replace("> 900", f"> {threshold_s}")
                    rule["for"] = f"{for_s}s"
                    changed += 1
        target = out_dir / path.name
        target.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        written.append(target)
    assert changed == 1, "RagpoolTrainingStalled not found exactly once"
    return written


class Prometheus:
    """``with Prometheus(...) as prom:`` runs prometheus until the block ends."""

    def __init__(self, binary: str, workdir: Path, rule_files: list[Path], scrape_targets: dict[str, list[str]],
                 interval: str = "1s") -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self.config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in scrape_targets.items()
            ],
        }
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "Prometheus":
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [self.binary, f"--config.file={config_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        try:
            wait_for(self._ready, 60, "prometheus /-/ready", retry_on=NOT_READY, poll_s=0.25,
                     seen=lambda: self.log()[-2000:])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        stop_process(self.process, timeout_s=15)

    def _ready(self) -> bool:
        if self.process and self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log()}")
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
            return response.status == 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=5) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise ValueError(f"{path}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.api("query", query=promql)["result"]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]
