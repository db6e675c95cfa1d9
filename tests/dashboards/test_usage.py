"""``ragpool usage`` against a real prometheus on 127.0.0.1, its TSDB backfilled (``promtool tsdb
create-blocks-from openmetrics``) with three hours of series shaped like the exporters' (kube-state-metrics,
DCGM, Kueue v0.19.2, OpenCost): the figures match the table worked out by hand below. And its bad input
(exit 2), an unreachable Prometheus (exit 4) and an unknown team (exit 3)."""

from __future__ import annotations

import json
import time

import pytest
from prometheus_harness import Prometheus, run_promtool

from contract import exit_codes
from contract.env import PROMETHEUS_URL_ENV
from contract.ports import free_port
from dashboards import teams, usage

MINUTES = 180
"""Samples at minutes 1..180 after T0, one a minute; the query ends at minute 180 and reaches back 4 hours."""

# The hand-computed table. Nodes: spot-1 (spot, 8 GPUs, $16/h: $2 per GPU-hour), od-1 (on-demand, 8 GPUs,
# $40/h: $5 per GPU-hour); other-1 is no ragpool pool's node.
#   team a: pod a-1 8 GPUs on spot-1 Running minutes 1-90 (12 GPU-h spot, $24), DCGM 50% (6 used);
#           pod a-2 4 GPUs on od-1 Pending 1-30, Running 31-90 (4 GPU-h on-demand, $20), DCGM 100% (4 used);
#           nominal 4 spot + 4 on-demand (8 GPUs, 24 GPU-h over 3 h); reserved 8 spot over minutes 1-90
#           (4 above nominal: 6 GPU-h borrowed), 4 on-demand over 31-90 (not above nominal).
#   team b: pod b-1 4 GPUs on od-1 Running 1-180 (12 GPU-h on-demand, $60), DCGM 25% (3 used); pod b-2 1 GPU
#           on other-1 (not a ragpool GPU node: not counted); nominal 4 on-demand, reserved 4: nothing borrowed.
#   main namespace: pod t-1 2 GPUs on spot-1 Running 121-180 (2 GPU-h spot, $4), DCGM 75% (1.5 used);
#           nominal 4 spot (12 GPU-h), reserved 2.
#   team c: no ClusterQueue; pod c-1 2 GPUs on od-2 (a pool node OpenCost has no price for) Running 1-60
#           (2 GPU-h on-demand, dollars unknown), DCGM 50% (1 used).
EXPECTED = {
    "a": dict(namespace="ragpool-team-a", nominal_gpus=8, allocated=16, spot=12, on_demand=4, used=10,
              nominal=24, borrowed=6, cost_usd=44, utilisation=10 / 16),
    "b": dict(namespace="ragpool-team-b", nominal_gpus=4, allocated=12, spot=0, on_demand=12, used=3,
              nominal=12, borrowed=0, cost_usd=60, utilisation=3 / 12),
    "ragpool-training": dict(namespace="ragpool-training", nominal_gpus=4, allocated=2, spot=2, on_demand=0,
                             used=1.5, nominal=12, borrowed=0, cost_usd=4, utilisation=1.5 / 2),
    "c": dict(namespace="ragpool-team-c", nominal_gpus=0, allocated=2, spot=0, on_demand=2, used=1, nominal=0,
              borrowed=0, cost_usd=None, utilisation=0.5),
}


def _series(minute_values) -> list[tuple[int, float]]:
    return [(i, float(minute_values(i))) for i in range(1, MINUTES + 1)]


def _between(lo: int, hi: int, value: float, other: float = 0.0):
    return lambda i: value if lo <= i <= hi else other


def exporter_series() -> dict[str, list[tuple[dict[str, str], list[tuple[int, float]]]]]:
    """Metric name -> [(labels, [(minute, value)])], as each exporter labels them."""
    ksm = {"job": "kube-state-metrics"}
    kueue = {"job": "kueue"}
    out: dict[str, list] = {}

    def add(name, labels, values):
        out.setdefault(name, []).append((labels, _series(values)))

    pool_node = {"label_ragpool_io_pool": "gpu", "label_node_kubernetes_io_instance_type": "p4d.24xlarge"}
    add("kube_node_labels", {**ksm, "node": "spot-1", **pool_node, "label_karpenter_sh_capacity_type": "spot"},
        lambda i: 1)
    add("kube_node_labels", {**ksm, "node": "od-1", **pool_node, "label_karpenter_sh_capacity_type": "on-demand"},
        lambda i: 1)
    add("kube_node_labels", {**ksm, "node": "od-2", **pool_node, "label_karpenter_sh_capacity_type": "on-demand"},
        lambda i: 1)
    add("kube_node_labels", {**ksm, "node": "other-1", "label_karpenter_sh_capacity_type": "on-demand"}, lambda i: 1)
    for node in ("spot-1", "od-1", "od-2", "other-1"):
        add("kube_node_status_capacity", {**ksm, "node": node, "resource": "nvidia_com_gpu", "unit": "integer"},
            lambda i: 8)
    add("node_total_hourly_cost", {"job": "opencost", "instance": "spot-1", "node": "spot-1",
                                   "instance_type": "p4d.24xlarge", "region": "eu-west-1", "provider_id": "i-1"},
        lambda i: 16)
    add("node_total_hourly_cost", {"job": "opencost", "instance": "od-1", "node": "od-1",
                                   "instance_type": "p4d.24xlarge", "region": "eu-west-1", "provider_id": "i-2"},
        lambda i: 40)

    pods = [  # namespace, pod, node, GPUs, running from, to, DCGM utilisation
        ("ragpool-team-a", "a-1", "spot-1", 8, 1, 90, 50),
        ("ragpool-team-a", "a-2", "od-1", 4, 31, 90, 100),
        ("ragpool-team-b", "b-1", "od-1", 4, 1, 180, 25),
        ("ragpool-team-b", "b-2", "other-1", 1, 1, 180, 100),
        ("ragpool-training", "t-1", "spot-1", 2, 121, 180, 75),
        ("ragpool-team-c", "c-1", "od-2", 2, 1, 60, 50),
    ]
    gpu_index = {"spot-1": 0, "od-1": 0, "od-2": 0, "other-1": 0}
    for namespace, pod, node, gpus, start, end, util in pods:
        labels = {**ksm, "namespace": namespace, "pod": pod, "uid": f"u-{pod}"}
        add("kube_pod_container_resource_requests", {**labels, "container": "worker", "node": node,
                                                     "resource": "nvidia_com_gpu", "unit": "integer"},
            lambda i, g=gpus: g)
        add("kube_pod_container_resource_requests", {**labels, "container": "worker", "node": node,
                                                     "resource": "cpu", "unit": "core"}, lambda i: 8)
        add("kube_pod_status_phase", {**labels, "phase": "Pending"}, lambda i, s=start: 1 if i < s else 0)
        add("kube_pod_status_phase", {**labels, "phase": "Running"}, _between(start, end, 1))
        add("kube_pod_status_phase", {**labels, "phase": "Succeeded"}, lambda i, e=end: 1 if i > e else 0)
        for _ in range(gpus):  # dcgm-exporter: one series per GPU; the pod's labels renamed exported_*
            index = gpu_index[node]
            gpu_index[node] += 1
            add("DCGM_FI_DEV_GPU_UTIL", {"job": "dcgm-exporter", "namespace": "gpu-operator", "node": node,
                                         "gpu": str(index), "UUID": f"GPU-{node}-{index}", "modelName": "A100",
                                         "exported_namespace": namespace, "exported_pod": pod,
                                         "exported_container": "worker"},
                _between(start, end, util))
    add("DCGM_FI_DEV_GPU_UTIL", {"job": "dcgm-exporter", "namespace": "gpu-operator", "node": "spot-1",
                                 "gpu": "7", "UUID": "GPU-spot-1-idle", "modelName": "A100"}, lambda i: 0)

    def cq(name, flavor, cohort="pool", role="leader"):
        return {**kueue, "cohort": cohort, "cluster_queue": name, "flavor": flavor, "resource": "nvidia.com/gpu",
                "replica_role": role}

    add("kueue_build_info", {**kueue, "git_version": "v0.19.2", "replica_role": "leader"}, lambda i: 1)
    add("kueue_cluster_queue_nominal_quota", cq("ragpool-team-a", "gpu-spot"), lambda i: 4)
    add("kueue_cluster_queue_nominal_quota", cq("ragpool-team-a", "gpu-ondemand"), lambda i: 4)
    add("kueue_cluster_queue_nominal_quota", cq("ragpool-team-b", "gpu-ondemand"), lambda i: 4)
    add("kueue_cluster_queue_nominal_quota", cq("ragpool-training", "gpu-spot"), lambda i: 4)
    add("kueue_cluster_queue_nominal_quota", {**cq("ragpool-team-b", "gpu-ondemand"), "resource": "cpu"},
        lambda i: 64)
    add("kueue_cluster_queue_resource_reservation", cq("ragpool-team-a", "gpu-spot"), _between(1, 90, 8))
    add("kueue_cluster_queue_resource_reservation", cq("ragpool-team-a", "gpu-ondemand"), _between(31, 90, 4))
    add("kueue_cluster_queue_resource_reservation", cq("ragpool-team-b", "gpu-ondemand"), lambda i: 4)
    add("kueue_cluster_queue_resource_reservation", cq("ragpool-training", "gpu-spot"), _between(121, 180, 2))
    # An HA follower's stale copy: left out.
    add("kueue_cluster_queue_resource_reservation", cq("ragpool-team-b", "gpu-ondemand", role="follower"),
        lambda i: 100)
    add("kueue_pending_workloads", {**kueue, "cluster_queue": "ragpool-team-a", "status": "active",
                                    "replica_role": "leader"}, _between(1, 30, 1))
    return out


def openmetrics(t0: int) -> str:
    """The series as an OpenMetrics exposition with a timestamp per sample (grouped by family, as promtool
    requires)."""
    lines = []
    for name, series in sorted(exporter_series().items()):
        lines.append(f"# TYPE {name} gauge")
        for labels, points in series:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.extend(f"{name}{{{text}}} {value:g} {t0 + 60 * minute}" for minute, value in points)
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def backfilled(promtool, prometheus_bin, tmp_path_factory):
    """A prometheus serving the backfilled series; yields (url, the minute-180 time)."""
    workdir = tmp_path_factory.mktemp("usage-prometheus")
    t_end = int(time.time()) // 60 * 60 - 120
    t0 = t_end - 60 * MINUTES
    source = workdir / "series.om"
    source.write_text(openmetrics(t0))
    result = run_promtool(promtool, "tsdb", "create-blocks-from", "openmetrics", source, workdir / "data")
    assert result.returncode == 0, result.stdout + result.stderr
    with Prometheus(prometheus_bin, workdir, [], {}) as prom:
        yield prom.url, t_end


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = usage.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_usage_matches_the_hand_computed_table(backfilled, capsys):
    url, t_end = backfilled
    code, out, err = _run(capsys, "--prometheus", url, "--since", "4h", "--until", str(t_end), "--output", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["since"] == "4h" and report["until"] == usage._iso(t_end)
    got = {row.pop("team"): row for row in report["teams"]}
    assert set(got) == set(EXPECTED)
    for team, expected in EXPECTED.items():
        for key, value in expected.items():
            want = value if value is None or isinstance(value, str) else pytest.approx(value, abs=1e-9)
            assert got[team][key] == want, (team, key)


@pytest.mark.slow
def test_one_team_as_a_table_and_an_unknown_team(backfilled, capsys, monkeypatch):
    url, t_end = backfilled
    monkeypatch.setenv(PROMETHEUS_URL_ENV, url)
    code, out, err = _run(capsys, "--team", "a", "--since", "4h", "--until", str(t_end))
    assert code == 0, err
    header, columns, row = out.splitlines()
    assert header == f"GPU usage per team in the 4h before {usage._iso(t_end)}"
    assert columns.split() == ["TEAM", "NOMINAL_GPUS", "ALLOC_GPU_H", "USED_GPU_H", "UTIL", "SPOT_GPU_H",
                               "ON_DEMAND_GPU_H", "NOMINAL_GPU_H", "BORROWED_GPU_H", "COST_USD"]
    assert row.split() == ["a", "8", "16.0", "10.0", "62%", "12.0", "4.0", "24.0", "6.0", "44.00"]
    # The namespace names the same team; a team with no ClusterQueue and no usage is not found.
    code, out, _ = _run(capsys, "--team", "ragpool-team-a", "--since", "4h", "--until", str(t_end))
    assert code == 0 and out.splitlines()[2].split()[0] == "a"
    code, out, _ = _run(capsys, "--team", "c", "--since", "4h", "--until", str(t_end))
    assert code == 0 and out.splitlines()[2].split() == ["c", "0", "2.0", "1.0", "50%", "0.0", "2.0", "0.0", "0.0",
                                                         "-"]
    code, out, err = _run(capsys, "--team", "d", "--since", "4h", "--until", str(t_end))
    assert code == exit_codes.NOT_FOUND and out == "" and "team 'd' has no ClusterQueue" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--since", "7x"], "--since '7x': give a duration like 30m"),
    (["--since", "500d"], "--since '500d': at most 400d"),
    (["--until", "yesterday"], "--until 'yesterday': give an ISO 8601 time"),
    (["--until", "nan"], "--until 'nan': not a time"),
    (["--team", "Team A"], "--team 'Team A': not a team or namespace name"),
    (["--prometheus", "127.0.0.1:9090"], "--prometheus '127.0.0.1:9090': not an http:// or https:// URL"),
])
def test_bad_input_exits_2_naming_the_flag(capsys, argv, message):
    code, out, err = _run(capsys, "--prometheus", "http://127.0.0.1:9", *argv)
    assert code == exit_codes.BAD_INPUT and out == ""
    assert message in err and "Traceback" not in err, err


def test_no_prometheus_url_exits_2_naming_the_variable(capsys, monkeypatch):
    monkeypatch.delenv(PROMETHEUS_URL_ENV, raising=False)
    code, _, err = _run(capsys)
    assert code == exit_codes.BAD_INPUT and f"--prometheus URL or set {PROMETHEUS_URL_ENV}" in err


def test_unreachable_prometheus_exits_4(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = _run(capsys, "--prometheus", url)
    assert code == exit_codes.UNAVAILABLE and out == ""
    assert f"cannot query {url}" in err and "Traceback" not in err


def test_until_accepts_iso_and_unix_times():
    assert usage.parse_until("2026-12-01T00:00:00Z") == usage.parse_until("2026-12-01T00:00:00") == 1796083200.0
    assert usage.parse_until("1796083200") == 1796083200.0
    assert usage.parse_window("2w") == 14 * 86400


def test_the_cohort_idle_quota_alert_reads_the_same_difference_as_the_dashboard():
    from dashboards import rulefiles

    (alert,) = [a for a in rulefiles.alerts() if a.name == "RagpoolTeamStarvedWhileCohortIdle"]
    assert " ".join(teams.COHORT_IDLE_GPUS.split()) in " ".join(alert.expr.split())
    assert teams.team_of("ragpool-team-a") == "a" and teams.team_of("ragpool-training") == "ragpool-training"


@pytest.mark.slow
def test_the_teams_dashboard_totals_show_the_same_figures(backfilled):
    """The "ragpool / Teams" table over a 4-hour range: allocated (A), used (B), borrowed (C), dollars (D)."""
    import urllib.parse
    import urllib.request

    from dashboards.build import to_dict
    from dashboards.boards import teams as teams_board

    url, t_end = backfilled
    board = to_dict(teams_board.build())
    (table,) = [p for p in board["panels"] if p["title"] == "GPU-hours and dollars over the time range by team"]
    columns = dict(zip("ABCD", ("allocated", "used", "borrowed", "cost_usd")))
    for target in table["targets"]:
        query = urllib.parse.urlencode({"query": target["expr"].replace("$__range", "4h"), "time": str(t_end)})
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
            result = json.load(response)["data"]["result"]
        got = {teams.team_of(r["metric"]["namespace"]): float(r["value"][1]) for r in result}
        # No series: dollars of a team without priced nodes; borrowing of a team without a ClusterQueue.
        want = {team: float(row[columns[target["refId"]]]) for team, row in EXPECTED.items()
                if row[columns[target["refId"]]] is not None and (target["refId"] != "C" or row["nominal_gpus"])}
        assert got == pytest.approx(want), target["refId"]


def test_ragpool_usage_is_a_command_of_the_ragpool_cli():
    from infra.cli import build_parser

    args = build_parser().parse_args(["usage", "--team", "a", "--since", "1d", "-o", "json"])
    assert args.handler is usage.cmd_usage and (args.team, args.since, args.output) == ("a", "1d", "json")
