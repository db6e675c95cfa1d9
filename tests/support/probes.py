"""Kubernetes HTTP probes asked the way the kubelet asks them, of a process the test started on 127.0.0.1."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any


def http_status(port: int, path: str, timeout_s: float = 5.0) -> int:
    """The status ``GET http://127.0.0.1:<port><path>`` answers (an error status returned, not raised; a
    refused connection raises ``OSError``)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def probe_codes(port: int, probes: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """``{probe kind: status}`` of a container's ``httpGet`` probes (``livenessProbe``, ...) served on ``port``."""
    return {kind: http_status(port, probe["path"]) for kind, probe in probes.items()}
