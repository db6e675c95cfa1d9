"""The Autoscaling dashboard: a row per ScaledJob (repeated over ``$scaledjob``) with the runs KEDA
reads, its Jobs and their pods Pending and Running, on the names KEDA and kube-state-metrics expose."""

from __future__ import annotations

import json

from dashboards import build
from dashboards.promql import metric_names


def _board() -> dict:
    return json.loads(build.render_all()["autoscaling.json"])


def test_a_row_per_scaledjob_with_queued_runs_jobs_and_pods():
    board = _board()
    rows = [p for p in board["panels"] if p["type"] == "row"]
    [per_kind] = [r for r in rows if r.get("repeat") == "scaledjob"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert "scaledObject" in variables["scaledjob"]["query"]  # KEDA's label for the ScaledJob's name
    panels = board["panels"]
    start = panels.index(per_kind)
    following = panels[start + 1:]
    titles = [p["title"] for p in following]
    assert titles[:3] == ["Queued runs (KEDA's count)", "Jobs", "Pods Pending and Running"]
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in following}
    for title in titles[:3]:
        assert all('"$scaledjob"' in e for e in exprs[title]), title  # each panel follows the repeated value
    assert "kube_pod_status_phase" in metric_names(exprs["Pods Pending and Running"][0])
    assert 'phase=~"Pending|Running"' in exprs["Pods Pending and Running"][0]


def test_the_rows_read_what_the_rules_record():
    from dashboards import rulefiles

    recorded = {r.name for r in rulefiles.recording_rules()}
    used = {name for p in _board()["panels"] for t in p.get("targets", []) for name in metric_names(t["expr"])}
    assert {"namespace_scaledjob:keda_queued_runs:sum", "namespace_scaledjob:kube_jobs_unfinished:count",
            "namespace_scaledjob:kube_jobs_pending:count"} <= used & recorded
