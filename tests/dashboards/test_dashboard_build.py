"""Rendered dashboards: deterministic, stable unique UIDs, every query parses (promtool),
and the `ragpool dashboards` command."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import yaml
from prometheus_harness import run_promtool

from dashboards import build, cli, inventory
from dashboards.boards import ALL
from dashboards.promql import expand_grafana_macros

# Grafana URLs and provisioning refer to these; changing one breaks links.
EXPECTED_UIDS = {
    "gpu-fleet": "ragpool-gpu-fleet",
    "training-runs": "ragpool-training-runs",
    "queue": "ragpool-queue",
    "capacity-cost": "ragpool-capacity-cost",
    "autoscaling": "ragpool-autoscaling",
    "teams": "ragpool-teams",
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    return {name: json.loads(text) for name, text in build.render_all().items()}


def _panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_two_builds_are_byte_identical(tmp_path):
    first = build.write_all(tmp_path / "a")
    second = build.write_all(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second]
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
    text = first[0].read_text()
    assert text.endswith("}\n")
    assert json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n" == text


def test_uids_are_stable_and_unique(rendered):
    uids = {name.removesuffix(".json"): board["uid"] for name, board in rendered.items()}
    assert uids == EXPECTED_UIDS
    assert len(set(uids.values())) == len(uids)


def test_duplicate_uids_are_refused(monkeypatch):
    monkeypatch.setitem(ALL, "copy-of-queue", ALL["queue"])
    with pytest.raises(ValueError, match="share uid 'ragpool-queue'"):
        build.render_all()


def test_output_has_no_volatile_fields(rendered):
    for name, board in rendered.items():
        text = json.dumps(board)
        for key in ('"created"', '"updated"', '"version"', '"iteration"'):
            assert key not in text, f"{name}: {key}"
        assert "id" not in board or board["id"] is None, name


def test_panels_have_unique_ids_titles_and_use_the_datasource_variable(rendered):
    for name, board in rendered.items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        titles = [p["title"] for p in _panels(board)]
        assert len(titles) == len(set(titles)), f"{name}: duplicate panel titles"
        variables = board["templating"]["list"]
        assert variables[0]["name"] == "datasource" and variables[0]["query"] == "prometheus"
        for panel in _panels(board):
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, panel["title"])
            assert panel.get("description"), f"{name}: panel {panel['title']!r} has no description"
            assert isinstance(panel.get("options"), dict), f"{name}: panel {panel['title']!r} has no options"
            assert panel["targets"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}"
                if panel["type"] == "table":
                    assert target["instant"] and target["format"] == "table", (name, panel["title"])


def test_the_four_dashboards_cover_the_issue(rendered):
    titles = {name: {p["title"] for p in _panels(board)} for name, board in rendered.items()}
    assert {"GPU utilisation by pool", "Framebuffer used per GPU", "GPU temperature", "Power draw per GPU",
            "XID errors by code (current window)", "ECC errors"} <= titles["gpu-fleet.json"]
    assert {"Loss", "Tokens per second by rank", "Step time p50 / p95 by run",
            "Checkpoint age per run and rank"} <= titles["training-runs.json"]
    assert {"Depth by priority", "Oldest waiting task", "Completions by outcome",
            "Retries and dead letters"} <= titles["queue.json"]
    assert {"GPU nodes by pool and capacity type", "GPUs by pool and capacity type"} <= titles["capacity-cost.json"]
    assert {"GPUs allocated by team and capacity type", "GPUs used by team (DCGM)", "Reserved vs nominal GPUs by team",
            "GPUs borrowed by team", "GPU cost per hour by team",
            "GPU-hours and dollars over the time range by team"} <= titles["teams.json"]


def test_every_dashboard_query_parses(promtool, tmp_path):
    expressions = inventory.dashboard_expressions()
    assert len(expressions) > 50
    for expression in expressions:
        # Template variables are only allowed inside string literals (then PromQL-valid).
        outside_strings = expand_grafana_macros(expression.expr)
        for quoted in re.findall(r'"(?:[^"\\]|\\.)*"', outside_strings):
            outside_strings = outside_strings.replace(quoted, '""')
        assert "$" not in outside_strings, f"{expression.where}: variable outside a string: {expression.expr}"
    rules = [
        {"record": f"ragpool_dashboard_check:expr_{index}:parse", "expr": expand_grafana_macros(e.expr)}
        for index, e in enumerate(expressions)
    ]
    path = tmp_path / "dashboard_exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-expressions", "rules": rules}]}))
    result = run_promtool(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_promtool_check_rejects_a_broken_expression(promtool, tmp_path):
    # The parse check above can fail: a real syntax error is reported.
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "x:y:z", "expr": "sum by (pool (up)"}]}]}))
    result = run_promtool(promtool, "check", "rules", path)
    assert result.returncode != 0


def test_variable_selector_parsing():
    assert inventory.variable_selector('label_values(ragpool:node_pool:info{pool=~"$pool"}, node)') == (
        'ragpool:node_pool:info{pool=~"$pool"}'
    )
    assert inventory.variable_selector("label_values(pool)") is None
    with pytest.raises(ValueError, match="only label_values"):
        inventory.variable_selector("query_result(up)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragpool")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_writes_every_dashboard(tmp_path, capsys):
    out = tmp_path / "out" / "dashboards"
    args = _parser().parse_args(["dashboards", "--out", str(out)])
    assert args.handler(args) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}.json" for stem in ALL)
    assert capsys.readouterr().out.count(".json") == len(ALL)
    assert json.loads((out / "queue.json").read_text())["uid"] == "ragpool-queue"


def test_cli_refuses_a_file_as_output_dir(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    args = _parser().parse_args(["dashboards", "--out", str(target)])
    assert args.handler(args) == 2
    assert "not a directory" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_cli_requires_out():
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["dashboards"])
    assert exc.value.code == 2


def test_cli_renders_a_row_per_lane_given(tmp_path):
    out = tmp_path / "out"
    args = _parser().parse_args(["dashboards", "--out", str(out), "--lanes", "pool.gpu-a,torchrun,pool.gpu-a.n2,ray"])
    assert args.handler(args) == 0
    board = json.loads((out / "autoscaling.json").read_text())
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Lane pool.gpu-a", "Lane torchrun", "Lane pool.gpu-a.n2", "Lane ray"]


@pytest.mark.parametrize(("lanes", "message"), [
    ("pool.gpu-a,gpu-b", "'gpu-b' is not one of"),
    (",", "names no lane"),
    ("pool.x-n2,pool.x.n2", "both 'label_lane_ragpool_io_pool_x_n2'"),
])
def test_cli_refuses_bad_lanes_with_exit_2(tmp_path, capsys, lanes, message):
    out = tmp_path / "out"
    args = _parser().parse_args(["dashboards", "--out", str(out), "--lanes", lanes])
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (out / "autoscaling.json").exists()
