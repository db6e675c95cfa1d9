"""``ragpool usage``: per team, the GPU-hours allocated (spot / on-demand) and used, the quota nominal and
borrowed, and the dollars, over a window, from the stack's Prometheus.

    ragpool usage [--team T] [--since 7d] [--until TIME] [--output table|json] [--prometheus URL]

The queries are dashboards/teams.py's (the "ragpool / Teams" dashboard shows the same); each window figure is
an instant query at ``--until`` (default now) over the ``--since`` window before it. Prometheus is
``--prometheus`` or ``$RAGPOOL_PROMETHEUS_URL`` (e.g. ``kubectl -n monitoring port-forward
svc/prometheus-operated 9090`` then ``http://127.0.0.1:9090``). Dollars need OpenCost scraped by that Prometheus
(dashboards/README.md); without it they are 0. Registered by ``infra/cli.py``.

Exit codes: 0 printed, 2 bad input (a flag's value, no Prometheus URL), 3 ``--team`` has no ClusterQueue and
no usage in the window, 4 Prometheus unreachable or failing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from contract import exit_codes
from contract.env import PROMETHEUS_URL_ENV

DEFAULT_SINCE = "7d"
MAX_WINDOW_S = 400 * 86400
"""Longest ``--since``: past Prometheus' usual retention the figures would only be partial anyway."""
TIMEOUT_S = 30.0
"""Each query's HTTP timeout."""
_DURATION = re.compile(r"([1-9][0-9]{0,5})([mhdw])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TEAM = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class UsageError(ValueError):
    """Bad input: the message names the flag and the value."""


class PrometheusUnavailable(RuntimeError):
    """Prometheus could not be reached, or refused a query."""


@dataclass
class TeamUsage:
    """One team's figures over the window (GPU-hours unless named otherwise)."""

    team: str
    """The team's name (``trainingTeams[].name``), or the main training namespace's name."""
    namespace: str
    """Its training namespace, also its Kueue ClusterQueue's name."""
    nominal_gpus: float = 0.0
    """Its ClusterQueue's nominal GPU quota at the end of the window (Kueue)."""
    allocated: float = 0.0
    """GPU-hours its Running pods held on ragpool GPU nodes (kube-state-metrics)."""
    spot: float = 0.0
    """Of ``allocated``, on spot nodes."""
    on_demand: float = 0.0
    """Of ``allocated``, on on-demand nodes (and nodes without a capacity type)."""
    used: float = 0.0
    """GPU-hours of DCGM utilisation of the GPUs its pods held."""
    nominal: float = 0.0
    """GPU-hours of nominal quota over the window (Kueue)."""
    borrowed: float = 0.0
    """GPU-hours reserved above its nominal quota, lent by the cohort (Kueue)."""
    cost_usd: float | None = 0.0
    """Dollars of the GPU nodes' prices its pods' share came to (OpenCost); None when it held GPUs but no node
    of them had a price (OpenCost not scraped)."""
    utilisation: float | None = field(default=None)
    """``used / allocated`` (None when nothing was allocated)."""


# --------------------------------------------------------------------------- input

def parse_window(value: str) -> int:
    """``--since``: ``30m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    m = _DURATION.fullmatch(value.strip())
    if not m:
        raise UsageError(f"--since {value[:40]!r}: give a duration like 30m, 12h, 7d or 2w")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > MAX_WINDOW_S:
        raise UsageError(f"--since {value!r}: at most {MAX_WINDOW_S // 86400}d")
    return seconds


def parse_until(value: str | None) -> float:
    """``--until``: an ISO 8601 time (``2026-12-01T00:00:00Z``; no zone = UTC) or a Unix time; default now."""
    if value is None:
        return datetime.now(timezone.utc).timestamp()
    text = value.strip()
    try:
        moment_s = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(moment_s) or moment_s <= 0:
            raise UsageError(f"--until {value[:40]!r}: not a time")
        return moment_s
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise UsageError(f"--until {value[:40]!r}: give an ISO 8601 time like 2026-12-01T00:00:00Z "
                         "or a Unix time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def prometheus_url(value: str | None) -> str:
    """``--prometheus``, else ``$RAGPOOL_PROMETHEUS_URL``: an http(s) URL."""
    url = value if value is not None else os.environ.get(PROMETHEUS_URL_ENV, "")
    if not url:
        raise UsageError(f"no Prometheus: pass --prometheus URL or set {PROMETHEUS_URL_ENV} "
                         "(e.g. http://127.0.0.1:9090 through kubectl port-forward)")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        source = "--prometheus" if value is not None else PROMETHEUS_URL_ENV
        raise UsageError(f"{source} {url[:80]!r}: not an http:// or https:// URL")
    return url.rstrip("/")


# --------------------------------------------------------------------------- queries

def instant_query(base_url: str, promql: str, at: float) -> list[dict[str, Any]]:
    """The result vector of ``promql`` evaluated at ``at`` (Prometheus' HTTP API ``/api/v1/query``)."""
    body = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"}).encode()
    request = urllib.request.Request(f"{base_url}/api/v1/query", data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            reply = json.load(response)
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        raise PrometheusUnavailable(f"{base_url} answered HTTP {exc.code}: {detail}") from None
    except (OSError, ValueError) as exc:  # refused, DNS, timeout, TLS; a body that is not JSON
        raise PrometheusUnavailable(f"cannot query {base_url}: {exc}") from None
    if not isinstance(reply, dict) or reply.get("status") != "success":
        raise PrometheusUnavailable(f"{base_url} refused a query: {str(reply)[:300]}")
    data = reply.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusUnavailable(f"{base_url}: expected an instant vector, got {data.get('resultType')!r}")
    return data.get("result") or []


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("error", ""))[:300]
    except (OSError, ValueError, AttributeError):
        return exc.reason if isinstance(exc.reason, str) else ""


def _value(sample: dict[str, Any]) -> float:
    value = float(sample["value"][1])
    return 0.0 if math.isnan(value) else value


def collect(base_url: str, window_s: int, until: float) -> dict[str, TeamUsage]:
    """Every team's figures over the ``window_s`` seconds before ``until``, keyed by namespace."""
    from dashboards import teams

    window = f"{window_s}s"
    out: dict[str, TeamUsage] = {}

    def team(labels: dict[str, str]) -> TeamUsage | None:
        namespace = labels.get("namespace", "")
        if not namespace:
            return None
        return out.setdefault(namespace, TeamUsage(team=teams.team_of(namespace), namespace=namespace))

    for sample in instant_query(base_url, teams.gpu_hours(teams.ALLOCATED, window, "namespace, capacity_type"), until):
        entry = team(sample["metric"])
        if entry is None:
            continue
        hours = _value(sample)
        entry.allocated += hours
        if sample["metric"].get("capacity_type") == "spot":
            entry.spot += hours
        else:
            entry.on_demand += hours
    figures = {
        "used": teams.gpu_hours(teams.USED, window),
        "nominal": teams.gpu_hours(teams.NOMINAL, window),
        "borrowed": teams.gpu_hours(teams.BORROWED, window),
        "cost_usd": teams.dollars(window),
        "nominal_gpus": teams.NOMINAL,
    }
    priced: set[str] = set()
    for attribute, promql in figures.items():
        for sample in instant_query(base_url, promql, until):
            entry = team(sample["metric"])
            if entry is not None:
                setattr(entry, attribute, getattr(entry, attribute) + _value(sample))
                if attribute == "cost_usd":
                    priced.add(entry.namespace)
    for entry in out.values():
        entry.utilisation = entry.used / entry.allocated if entry.allocated > 0 else None
        if entry.allocated > 0 and entry.namespace not in priced:
            entry.cost_usd = None
    return out


# --------------------------------------------------------------------------- output

_COLUMNS = (
    ("TEAM", "team", "{}"),
    ("NOMINAL_GPUS", "nominal_gpus", "{:g}"),
    ("ALLOC_GPU_H", "allocated", "{:.1f}"),
    ("USED_GPU_H", "used", "{:.1f}"),
    ("UTIL", "utilisation", "{:.0%}"),
    ("SPOT_GPU_H", "spot", "{:.1f}"),
    ("ON_DEMAND_GPU_H", "on_demand", "{:.1f}"),
    ("NOMINAL_GPU_H", "nominal", "{:.1f}"),
    ("BORROWED_GPU_H", "borrowed", "{:.1f}"),
    ("COST_USD", "cost_usd", "{:.2f}"),
)


def render_table(rows: list[TeamUsage], since: str, until: float) -> str:
    cells = [[title for title, _, _ in _COLUMNS]]
    for row in rows:
        cells.append(["-" if getattr(row, attr) is None else fmt.format(getattr(row, attr))
                      for _, attr, fmt in _COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    lines = [f"GPU usage per team in the {since} before {_iso(until)}"]
    for line in cells:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(line, widths))).rstrip())
    return "\n".join(lines)


def render_json(rows: list[TeamUsage], since: str, until: float) -> str:
    return json.dumps({"since": since, "until": _iso(until), "teams": [asdict(r) for r in rows]},
                      indent=2, sort_keys=True)


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- command

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "usage", help="per team: GPU-hours allocated and used, borrowed vs nominal, spot vs on-demand, dollars",
        description="Per team (training namespace), over a window, from the stack's Prometheus: GPU-hours "
                    "allocated (spot / on-demand) and used (DCGM), Kueue quota nominal and borrowed, and dollars "
                    "(OpenCost node prices). The 'ragpool / Teams' dashboard shows the same.")
    p.add_argument("--team", metavar="T", help="only this team (its name, or its namespace)")
    p.add_argument("--since", default=DEFAULT_SINCE, metavar="DURATION",
                   help=f"the window before --until: 30m, 12h, 7d, 2w (default {DEFAULT_SINCE})")
    p.add_argument("--until", default=None, metavar="TIME",
                   help="end of the window: ISO 8601 (2026-12-01T00:00:00Z) or a Unix time (default now)")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")
    p.add_argument("--prometheus", default=None, metavar="URL",
                   help=f"the stack's Prometheus (default ${PROMETHEUS_URL_ENV})")
    p.set_defaults(handler=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    try:
        window_s = parse_window(args.since)
        until = parse_until(args.until)
        url = prometheus_url(args.prometheus)
        if args.team is not None and not _TEAM.fullmatch(args.team):
            raise UsageError(f"--team {args.team[:80]!r}: not a team or namespace name (lower-case letters, "
                             "digits and '-')")
    except UsageError as exc:
        print(f"ragpool usage: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        usage = collect(url, window_s, until)
    except PrometheusUnavailable as exc:
        print(f"ragpool usage: {exc}", file=sys.stderr)
        return exit_codes.UNAVAILABLE
    rows = sorted(usage.values(), key=lambda r: r.namespace)
    if args.team is not None:
        rows = [r for r in rows if args.team in (r.team, r.namespace)]
        if not rows:
            print(f"ragpool usage: team {args.team!r} has no ClusterQueue and no usage from {args.since} before "
                  f"{_iso(until)}", file=sys.stderr)
            return exit_codes.NOT_FOUND
    render = render_json if args.output == "json" else render_table
    print(render(rows, args.since, until))
    return exit_codes.OK


def main(argv: list[str] | None = None) -> int:
    """``python -m dashboards.usage [--team T] [--since 7d] ...``: the same command without the ``ragpool`` CLI."""
    parser = argparse.ArgumentParser(prog="python -m dashboards.usage")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["usage", *(sys.argv[1:] if argv is None else argv)])
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
