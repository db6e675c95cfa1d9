"""The rule files: promtool check and unit tests, and the kubernetes-mixin conventions.

Every alert must have a promtool test that shows it silent one evaluation before its
`for` elapses and firing at it, with all labels and annotations; every recording rule a
`promql_expr_test`; every alert a runbook section.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from prometheus_harness import run_promtool

from dashboards import rulefiles

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "dashboards" / "RUNBOOK.md"
ALERT_NAME = re.compile(r"^(Ragpool|Gpu|Node)[A-Z][a-z0-9]*(?:[A-Z][a-z0-9]*)*$")
SEVERITIES = {"critical", "warning", "info"}
REQUIRED_ANNOTATIONS = {"summary", "description", "runbook_url"}


def _duration_minutes(text: str) -> int:
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?", text)
    if not match or not text:
        raise ValueError(f"unsupported duration {text!r} (use whole minutes/hours)")
    return int(match.group(1) or 0) * 60 + int(match.group(2) or 0)


def _test_files() -> list[Path]:
    return sorted(rulefiles.RULE_TESTS_DIR.glob("*.yaml"))


def _alert_cases() -> dict[str, list[tuple[Path, str, int, list]]]:
    """alertname -> [(test file, test name, eval minute, exp_alerts)]."""
    cases: dict[str, list[tuple[Path, str, int, list]]] = {}
    for path in _test_files():
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                cases.setdefault(case["alertname"], []).append(
                    (path, test.get("name", "?"), _duration_minutes(case["eval_time"]), case.get("exp_alerts") or [])
                )
    return cases


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    slug = heading.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def _runbook_anchors() -> dict[str, str]:
    return {_slug(line[3:]): line[3:].strip() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}


def test_promtool_check_rules(promtool):
    files = rulefiles.rule_files()
    assert len(files) >= 5
    result = run_promtool(promtool, "check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # promtool evaluates every rule file for each test group: ~15 CPU-s
def test_promtool_unit_tests_pass(promtool):
    files = _test_files()
    result = run_promtool(promtool, "test", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


@pytest.mark.slow
def test_promtool_unit_tests_catch_a_wrong_threshold(promtool, tmp_path):
    # The tests must be able to fail: make RagpoolTrainingStalled 10x less sensitive.
    shutil.copytree(rulefiles.RULES_DIR, tmp_path / "rules")
    training = tmp_path / "rules" / "training.yaml"
    text = training.read_text()
    assert text.count("> 900") == 1
    training.write_text(text.replace("> 900", "> 9000"))
    result = run_promtool(promtool, "test", "rules", tmp_path / "rules" / "tests" / "training_test.yaml")
    assert result.returncode != 0
    assert "RagpoolTrainingStalled" in result.stdout + result.stderr


def test_rule_tests_load_every_rule_file_in_dependency_order():
    expected_order = rulefiles.group_eval_order()
    for path in _test_files():
        data = yaml.safe_load(path.read_text())
        assert data["rule_files"] == ["../*.yaml"], path
        assert data["group_eval_order"] == expected_order, f"{path}: group_eval_order out of date"


def test_group_eval_order_puts_recording_dependencies_first():
    order = rulefiles.group_eval_order()
    assert order.index("ragpool-cluster.rules") < order.index("ragpool-gpu.rules")
    assert order.index("ragpool-budget.rules") < order.index("ragpool-cluster.alerts")
    first_alerts = next(i for i, g in enumerate(order) if g.endswith(".alerts"))
    assert all(g.endswith(".alerts") for g in order[first_alerts:])  # every recording group first


def test_every_alert_fires_exactly_when_its_for_elapses():
    alerts = {a.name: a for a in rulefiles.alerts()}
    assert len(alerts) == len(rulefiles.alerts()), "duplicate alert names"
    cases = _alert_cases()
    untested = sorted(set(alerts) - set(cases))
    assert not untested, f"alerts without a promtool test: {untested}"
    assert not set(cases) - set(alerts), f"tests for unknown alerts: {sorted(set(cases) - set(alerts))}"
    for name, alert in alerts.items():
        for_minutes = _duration_minutes(alert.body.get("for", ""))
        assert for_minutes >= 1, f"{name}: a `for` of at least 1m lets tests show the pending step"
        firing = [c for c in cases[name] if c[3]]
        silent_minutes = {(c[0], c[1], c[2]) for c in cases[name] if not c[3]}
        assert firing, f"{name}: no test where it fires"
        assert any((path, test, minute - 1) in silent_minutes for path, test, minute, _ in firing), (
            f"{name}: no test silent one evaluation (1m) before a firing evaluation"
        )
        for path, test, minute, exp_alerts in firing:
            assert minute >= for_minutes, f"{path.name} {test!r}: {name} fires before its `for` could elapse"
            for exp in exp_alerts:
                labels = exp.get("exp_labels") or {}
                annotations = exp.get("exp_annotations") or {}
                assert labels.get("severity") == alert.body["labels"]["severity"], f"{path.name} {test!r}: {name}"
                assert set(annotations) == set(alert.body["annotations"]), (
                    f"{path.name} {test!r}: {name} must assert every annotation"
                )
                assert "{{" not in "".join(map(str, annotations.values())), f"{name}: unexpanded template"


def test_every_recording_rule_has_an_expression_test():
    tested: set[str] = set()
    for path in _test_files():
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("promql_expr_test") or []:
                if case.get("exp_samples"):
                    tested.add(case["expr"].strip())
    missing = sorted(r.name for r in rulefiles.recording_rules() if r.name not in tested)
    assert not missing, f"recording rules without a promql_expr_test: {missing}"


@pytest.mark.parametrize("alert", rulefiles.alerts(), ids=lambda a: a.name)
def test_alert_follows_the_mixin_conventions(alert):
    assert ALERT_NAME.match(alert.name), f"{alert.name}: CamelCase with prefix Ragpool, Gpu or Node"
    labels = alert.body.get("labels") or {}
    assert labels.get("severity") in SEVERITIES, f"{alert.name}: severity {labels.get('severity')!r}"
    annotations = alert.body.get("annotations") or {}
    assert REQUIRED_ANNOTATIONS <= set(annotations), f"{alert.name}: missing {REQUIRED_ANNOTATIONS - set(annotations)}"
    assert annotations["summary"].strip() and "{{" not in annotations["summary"], (
        f"{alert.name}: summary is a fixed sentence"
    )
    assert "{{ $labels." in annotations["description"] or "{{ $value" in annotations["description"], (
        f"{alert.name}: description must be templated"
    )
    url = annotations["runbook_url"]
    assert url.startswith(rulefiles.RUNBOOK_PREFIX), f"{alert.name}: runbook_url {url!r}"
    anchors = _runbook_anchors()
    anchor = url[len(rulefiles.RUNBOOK_PREFIX):]
    assert anchor in anchors, f"{alert.name}: RUNBOOK.md has no section for #{anchor}"
    assert anchors[anchor] == alert.name, f"{alert.name}: runbook anchor points at section {anchors[anchor]!r}"


def test_runbook_has_one_complete_section_per_alert():
    text = RUNBOOK.read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    titles = [s.splitlines()[0].strip() for s in sections]
    assert sorted(titles) == sorted(a.name for a in rulefiles.alerts())
    for section in sections:
        for part in ("**Meaning.**", "**Impact.**", "**Diagnosis.**", "**Mitigation.**"):
            assert part in section, f"runbook section {section.splitlines()[0]!r} lacks {part}"


def test_recording_rule_names_follow_level_metric_operation():
    for rule in rulefiles.recording_rules():
        assert re.fullmatch(r"[a-z_]+:[a-zA-Z0-9_]+:[a-z0-9_]+", rule.name), rule.name


def test_with_runbook_base_prefixes_only_runbook_links():
    groups = rulefiles.load_groups(rulefiles.RULES_DIR / "gpu.yaml")
    rebased = rulefiles.with_runbook_base(groups, "https://example.org/ragpool/blob/main/")
    first_alert = next(r for r in rebased[1]["rules"] if "alert" in r)
    assert first_alert["annotations"]["runbook_url"] == (
        "https://example.org/ragpool/blob/main/dashboards/RUNBOOK.md#gpuxiderrorcritical"
    )
    original = next(r for r in groups[1]["rules"] if "alert" in r)
    assert original["annotations"]["runbook_url"] == "dashboards/RUNBOOK.md#gpuxiderrorcritical"


def test_loader_names_the_file_of_a_malformed_rule(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - expr: up\n")
    with pytest.raises(rulefiles.RuleFileError, match=r"bad\.yaml.*neither alert nor record"):
        rulefiles.load_rules(tmp_path)
    bad.write_text("rules: []\n")
    with pytest.raises(rulefiles.RuleFileError, match=r"bad\.yaml.*'groups'"):
        rulefiles.load_rules(tmp_path)


def test_budget_comes_from_config_for_deployment():
    groups = rulefiles.deployment_rule_groups(gpu_hours_budget=12000)
    budget_rules = [r for g in groups["budget"] for r in g["rules"]]
    assert budget_rules == [{"record": "ragpool:gpu_hours_budget:30d", "expr": "vector(12000)"}]
    # The shipped file keeps the value the promtool tests were written for.
    assert "vector(5000)" in (rulefiles.RULES_DIR / "budget.yaml").read_text()
    for bad in (0, -5, "5000", True):
        with pytest.raises(ValueError, match="positive number"):
            rulefiles.with_gpu_hours_budget(groups["budget"], bad)


def test_deployment_groups_are_valid_prometheusrule_specs():
    import jsonschema

    from scripts.vendor_schemas import VENDOR_DIR

    schema_path = VENDOR_DIR / "crds" / "monitoring.coreos.com" / "prometheusrule_v1.json"
    schema = json.loads(schema_path.read_text())
    groups_by_file = rulefiles.deployment_rule_groups("https://example.org/ragpool/blob/main", 5000)
    assert set(groups_by_file) == {p.stem for p in rulefiles.rule_files()}
    for stem, groups in groups_by_file.items():
        rule = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": f"ragpool-{stem}"},
            "spec": {"groups": groups},
        }
        jsonschema.Draft4Validator(schema).validate(rule)
        for group in groups:
            for r in group["rules"]:
                if "alert" in r:
                    url = r["annotations"]["runbook_url"]
                    assert url.startswith("https://example.org/ragpool/blob/main/dashboards/RUNBOOK.md#")
