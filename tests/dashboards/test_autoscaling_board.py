"""The Autoscaling dashboard: a row per lane of the stack with the lane's queued runs (the queue
keeper), its worker Jobs and their pods Pending and Running (kube-state-metrics, by the Jobs' and
pods' ``lane.ragpool.io/<lane>`` labels); the panel queries evaluated by promtool on series shaped
as kube-state-metrics and the keeper expose them."""

from __future__ import annotations

import json

import pytest
import yaml
from prometheus_harness import run_promtool

from dashboards import build
from dashboards.boards import autoscaling
from dashboards.promql import expand_grafana_macros, metric_names
from contract.lanes import Lane

# The default pool gpu-spot: its single-pod Jobs claim pool.gpu-spot and the unpinned torchrun lane;
# its 2-node Jobs pool.gpu-spot.n2 and torchrun.n2; the CPU worker the ray lane.
LANES = (Lane(pool="gpu-spot"), Lane(), Lane(nodes=2, pool="gpu-spot"), Lane(nodes=2), Lane("ray"))


def _board(lanes=LANES) -> dict:
    return json.loads(build.render_all(lanes)["autoscaling.json"])


def _lane_rows(board: dict) -> dict[str, list[dict]]:
    """Row title -> the panels under it."""
    rows: dict[str, list[dict]] = {}
    current = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], list(panel.get("panels") or []))  # a collapsed row's own
        else:
            current.append(panel)
    return rows


def _all_panels(board: dict) -> list[dict]:
    return [q for p in board["panels"] for q in (p, *(p.get("panels") or []))]


def test_a_row_per_lane_with_queued_runs_jobs_and_pods():
    rows = _lane_rows(_board())
    assert list(rows) == ["Overview", *(f"Lane {lane.name}" for lane in LANES)]
    for lane in LANES:
        panels = rows[f"Lane {lane.name}"]
        assert [p["title"] for p in panels] == [f"{lane.name}: queued runs", f"{lane.name}: Jobs",
                                                f"{lane.name}: pods Pending and Running"]
        queued, jobs, pods = ([t["expr"] for t in p["targets"]] for p in panels)
        assert metric_names(queued[0]) == {"ragpool_lane_queued"} and f'lane="{lane.name}"' in queued[0]
        label = "label_lane_ragpool_io_" + lane.name.replace(".", "_").replace("-", "_")
        assert all(f'{label}="true"' in e for e in jobs + pods), lane
        assert {"kube_job_labels"} <= metric_names(jobs[0]) and "kube_pod_status_ready" in metric_names(jobs[1])
        assert metric_names(pods[0]) == {"kube_pod_status_phase", "kube_pod_labels"}
    row_panels = {p["title"]: p for p in _board()["panels"] if p["type"] == "row"}
    assert not any(r.get("repeat") for r in row_panels.values())
    # Multi-node lanes (one per gang size a pool holds) are folded; the others open.
    assert {title for title, r in row_panels.items() if r.get("collapsed")} == {"Lane pool.gpu-spot.n2", "Lane torchrun.n2"}


def test_the_rows_follow_the_lanes_given_and_default_to_the_pool_free_lanes():
    assert list(_lane_rows(_board((Lane("ray"), Lane(pool="a"), Lane("ray"))))) == ["Overview", "Lane ray", "Lane pool.a"]
    default = json.loads(build.render_all()["autoscaling.json"])
    assert list(_lane_rows(default)) == ["Overview", "Lane torchrun", "Lane ray"]


def test_lanes_with_the_same_kube_state_metrics_label_are_refused():
    # pool "x-n2" single-pod and pool "x" 2-node: lane.ragpool.io/pool.x-n2 and .../pool.x.n2 are both
    # label_lane_ragpool_io_pool_x_n2 in kube-state-metrics; one row would count the other's Jobs.
    with pytest.raises(ValueError, match="'pool.x-n2' and 'pool.x.n2'.*label_lane_ragpool_io_pool_x_n2"):
        autoscaling.build((Lane(pool="x-n2"), Lane(nodes=2, pool="x")))


def test_the_overview_reads_what_the_rules_record():
    from dashboards import rulefiles

    recorded = {r.name for r in rulefiles.recording_rules()}
    overview = _lane_rows(_board())["Overview"]
    used = {name for p in overview for t in p["targets"] for name in metric_names(t["expr"])}
    assert {"namespace_scaledjob:keda_queued_runs:sum", "namespace_scaledjob:kube_jobs_unfinished:count",
            "namespace_scaledjob:kube_jobs_pending:count"} <= used & recorded


# ---------------------------------------------------------------- the queries on real series

_NS = "ragpool-training"
_KSM = 'job="kube-state-metrics"'
_SPOT = "label_lane_ragpool_io_pool_gpu_spot"
_UNPINNED = "label_lane_ragpool_io_torchrun"


def _job(name: str, labels: str, complete: int = 0, failed: int = 0) -> list[dict]:
    return [
        {"series": f'kube_job_labels{{{_KSM}, namespace="{_NS}", job_name="{name}", {labels}}}', "values": "1x5"},
        {"series": f'kube_job_complete{{{_KSM}, namespace="{_NS}", job_name="{name}", condition="true"}}',
         "values": f"{complete}x5"},
        {"series": f'kube_job_failed{{{_KSM}, namespace="{_NS}", job_name="{name}", condition="true"}}',
         "values": f"{failed}x5"},
    ]


def _pod(name: str, job: str, labels: str, phase: str, ready: int) -> list[dict]:
    ident = f'{_KSM}, namespace="{_NS}", pod="{name}", uid="{name}"'
    return [
        {"series": f"kube_pod_labels{{{ident}, {labels}}}", "values": "1x5"},
        {"series": f'kube_pod_owner{{{ident}, owner_kind="Job", owner_name="{job}", owner_is_controller="true"}}',
         "values": "1x5"},
        {"series": f'kube_pod_status_ready{{{ident}, condition="true"}}', "values": f"{ready}x5"},
        *({"series": f'kube_pod_status_phase{{{ident}, phase="{p}"}}', "values": f"{int(p == phase)}x5"}
          for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown")),
    ]


def _queued(queue: str, lane: str, value: int) -> dict:
    return {"series": f'ragpool_lane_queued{{job="ragpool-queue", namespace="{_NS}", queue="{queue}", lane="{lane}"}}',
            "values": f"{value}x5"}


def _panel_expr(board: dict, title: str, ref: str = "A") -> str:
    """A panel's query as Grafana sends it with every namespace and queue selected (All = .*)."""
    [panel] = [p for p in _all_panels(board) if p.get("title") == title]
    [expr] = [t["expr"] for t in panel["targets"] if t["refId"] == ref]
    return expand_grafana_macros(expr.replace("$namespace", ".*").replace("$queue", ".*"))


def test_the_lane_queries_count_that_lanes_runs_jobs_and_pods(promtool, tmp_path):
    """Default-pool single-pod Jobs (labelled for pool.gpu-spot and torchrun): one running (pod Ready),
    one whose pod is Pending, one finished; a 2-node Job of pool.gpu-spot.n2 that failed. The queue
    holds runs of torchrun in two queues and of pool.gpu-spot in one."""
    both = f'{_SPOT}="true", {_UNPINNED}="true"'
    n2 = 'label_lane_ragpool_io_pool_gpu_spot_n2="true", label_lane_ragpool_io_torchrun_n2="true"'
    series = [
        *_job("spot-run", both), *_pod("spot-run-0-a", "spot-run", both, "Running", 1),
        *_job("spot-new", both), *_pod("spot-new-0-b", "spot-new", both, "Pending", 0),
        *_job("spot-done", both, complete=1), *_pod("spot-done-0-c", "spot-done", both, "Succeeded", 0),
        *_job("spot-n2-failed", n2, failed=1), *_pod("spot-n2-failed-0-d", "spot-n2-failed", n2, "Failed", 0),
        _queued("ragpool", "torchrun", 2), _queued("team-a", "torchrun", 4), _queued("ragpool", "pool.gpu-spot", 1),
        _queued("ragpool", "ray", 0),
    ]
    board = _board()
    unfinished = [{"labels": f'{{namespace="{_NS}"}}', "value": 2}]
    tests = []
    for lane in ("pool.gpu-spot", "torchrun"):
        tests += [
            {"expr": _panel_expr(board, f"{lane}: Jobs", "A"), "eval_time": "2m", "exp_samples": unfinished},
            {"expr": _panel_expr(board, f"{lane}: Jobs", "B"), "eval_time": "2m",
             "exp_samples": [{"labels": f'{{namespace="{_NS}"}}', "value": 1}]},
            {"expr": _panel_expr(board, f"{lane}: pods Pending and Running"), "eval_time": "2m", "exp_samples": [
                {"labels": f'{{namespace="{_NS}", phase="Pending"}}', "value": 1},
                {"labels": f'{{namespace="{_NS}", phase="Running"}}', "value": 1}]},
        ]
    for lane in ("pool.gpu-spot.n2", "ray"):  # a failed Job is not a worker; ray has none
        tests += [{"expr": _panel_expr(board, f"{lane}: Jobs", ref), "eval_time": "2m", "exp_samples": []}
                  for ref in "AB"]
        tests.append({"expr": _panel_expr(board, f"{lane}: pods Pending and Running"), "eval_time": "2m",
                      "exp_samples": []})
    tests += [
        {"expr": _panel_expr(board, "torchrun: queued runs"), "eval_time": "2m", "exp_samples": [
            {"labels": '{queue="ragpool"}', "value": 2}, {"labels": '{queue="team-a"}', "value": 4}]},
        {"expr": _panel_expr(board, "pool.gpu-spot: queued runs"), "eval_time": "2m", "exp_samples": [
            {"labels": '{queue="ragpool"}', "value": 1}]},
        {"expr": _panel_expr(board, "ray: queued runs"), "eval_time": "2m", "exp_samples": [
            {"labels": '{queue="ragpool"}', "value": 0}]},
    ]
    (tmp_path / "none.yaml").write_text("groups: []\n")
    path = tmp_path / "autoscaling_board_test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": ["none.yaml"], "evaluation_interval": "1m", "tests": [
        {"name": "per-lane panels", "interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    result = run_promtool(promtool, "test", "rules", path, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

    # ... and can fail: the torchrun row must not count the 2-node lane's Job.
    tests[0]["exp_samples"] = [{"labels": f'{{namespace="{_NS}"}}', "value": 3}]
    path.write_text(yaml.safe_dump({"rule_files": ["none.yaml"], "evaluation_interval": "1m", "tests": [
        {"name": "per-lane panels", "interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    assert run_promtool(promtool, "test", "rules", path, cwd=tmp_path).returncode != 0
