"""`ragpool plan`, `plan-diff` and `config check` as users run them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from infra.plan import plan_diff
from infra.stack import REPO_ROOT

RAGPOOL = [sys.executable, "-m", "infra.cli"]


def run(*args, cwd=REPO_ROOT):
    return subprocess.run([*RAGPOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_plan_json_to_file_and_tree(tmp_path):
    out = tmp_path / "dev.json"
    res = run("plan", "--stack", "dev", "--format", "tree", "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert res.stdout.startswith(f"ragpool-dev: {len(doc['resources'])} resources")
    assert "  +-network-vpc (aws:ec2/vpc:Vpc)" in res.stdout
    keys = [(r["type"], r["name"]) for r in doc["resources"]]
    assert keys == sorted(keys)
    assert all(set(r) >= {"type", "name", "parent", "inputs"} for r in doc["resources"])


def _broken_root(tmp_path: Path, **overrides) -> Path:
    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    doc = yaml.safe_load((REPO_ROOT / "Pulumi.dev.yaml").read_text())
    doc["config"].update(overrides)
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_plan_bad_config_is_one_line_no_traceback(tmp_path):
    root = _broken_root(tmp_path, **{"ragpool:vpcCidr": "10.0.0.0/33"})
    res = run("plan", "--stack", "dev", "--root", str(root))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "ragpool:vpcCidr" in res.stderr and "10.0.0.0/33" in res.stderr


def test_plan_unknown_stack(tmp_path):
    res = run("plan", "--stack", "staging")
    assert res.returncode == 2 and "no stack file Pulumi.staging.yaml" in res.stderr


def test_config_check_reports_every_problem_with_file_key_value_fix(tmp_path):
    root = _broken_root(tmp_path, **{
        "ragpool:vpcCidr": "10.0.0.0/33", "ragpool:systemNodeMinCount": 9, "ragpool:gpuPool": [],
        "ragpool:alertReceiver": "slack",
        "ragpool:gpuPools": [{"name": "x", "instanceTypes": ["t3.large"], "capacityType": "spot", "gpuLimit": 1}]})
    res = run("config", "check", "--stack", "dev", "--root", str(root))
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("  Pulumi.dev.yaml: ")]
    assert len(lines) == 5, res.stderr
    for fragment in ("ragpool:vpcCidr", "systemNodeMinCount = 9", "did you mean gpuPools",
                     "alertReceiverSecret is required", "t3.large"):
        assert any(fragment in ln for ln in lines), fragment
    assert "pulumi config" in res.stderr  # the fix is spelled out


def test_config_check_ok_for_committed_stacks():
    res = run("config", "check", "--stack", "dev", "--stack", "prod")
    assert res.returncode == 0, res.stderr
    assert "Pulumi.prod.yaml: ok (prod, 3 AZs, 3 GPU pool(s))" in res.stdout


def test_plan_diff_reads_like_a_review(committed_plans, tmp_path):
    text = plan_diff(committed_plans["dev"], committed_plans["prod"])
    first = text.splitlines()[0]
    import re

    assert re.fullmatch(r"Plan diff ragpool-dev -> ragpool-prod: \d+ to add, \d+ to change, \d+ to remove", first)
    assert "+ kubernetes:karpenter.sh/v1:NodePool (2): gpu-gpu-ondemand, gpu-gpu-ondemand-p5" in text
    assert "~ vpcConfig.endpointPublicAccess: true => false" in text
    assert "~ [protect]: False => True" in text
    assert "~ tags.environment: \"dev\" => \"prod\"" in text and "resources)" in text
    assert "{" not in first and '"inputs"' not in text  # not a JSON dump
    # CLI on files, and bad input
    (tmp_path / "a.json").write_text(json.dumps(committed_plans["dev"]))
    (tmp_path / "b.json").write_text(json.dumps(committed_plans["prod"]))
    res = run("plan-diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert res.returncode == 0 and res.stdout == text
    (tmp_path / "bad.json").write_text("[1]")
    res = run("plan-diff", str(tmp_path / "a.json"), str(tmp_path / "bad.json"))
    assert res.returncode == 2 and "not a ragpool plan" in res.stderr


def test_plan_diff_shows_helm_values_and_k8s_objects_as_yaml(committed_plans):
    import copy

    new = copy.deepcopy(committed_plans["dev"])
    for r in new["resources"]:
        if r["name"] == "gpu-karpenter":
            r["inputs"]["values"]["replicas"] = 3
        if r["type"] == "kubernetes:karpenter.sh/v1:NodePool":
            r["inputs"]["spec"]["limits"]["nvidia.com/gpu"] = "16"
    text = plan_diff(committed_plans["dev"], new)
    assert "Plan diff ragpool-dev -> ragpool-dev: 0 to add, 2 to change, 0 to remove" in text
    assert "-replicas: 2\n        +replicas: 3" in text
    assert "-  nvidia.com/gpu: '8'\n        +  nvidia.com/gpu: '16'" in text


def test_plan_diff_shows_a_json_document_by_field_and_caps_each_resource(committed_plans, tmp_path):
    """A rendered dashboard (JSON text in a ConfigMap) diffs by field, not as escaped text; a resource's
    change longer than MAX_DIFF_LINES_PER_RESOURCE is cut with a count, and --full shows all of it."""
    import copy

    from infra.plan import MAX_DIFF_LINES_PER_RESOURCE

    new = copy.deepcopy(committed_plans["dev"])
    board = next(r for r in new["resources"] if r["name"] == "monitoring-dashboard-autoscaling")
    (key, text), = board["inputs"]["data"].items()
    doc = json.loads(text)
    doc["title"] = "renamed board"
    doc["panels"] += [{"id": 1000 + i, "title": f"extra {i}", "type": "row"} for i in range(40)]
    board["inputs"]["data"][key] = json.dumps(doc)
    capped = plan_diff(committed_plans["dev"], new)
    assert "+    title: extra 0" in capped and "\\n" not in capped  # fields, not escaped JSON text
    lines = capped.split("  ~ monitoring-dashboard-autoscaling", 1)[1].splitlines()[1:]
    assert len(lines) == MAX_DIFF_LINES_PER_RESOURCE + 1
    assert re.fullmatch(r"    \.\.\. \d+ more changed lines \(`ragpool plan-diff --full OLD NEW` shows them\)", lines[-1])
    full = plan_diff(committed_plans["dev"], new, max_lines=None)
    assert "title: extra 39" in full and "+  title: renamed board" in full and "more changed lines" not in full
    (tmp_path / "a.json").write_text(json.dumps(committed_plans["dev"]))
    (tmp_path / "b.json").write_text(json.dumps(new))
    assert run("plan-diff", "--full", str(tmp_path / "a.json"), str(tmp_path / "b.json")).stdout == full


def test_plan_diff_no_changes(committed_plans):
    assert plan_diff(committed_plans["dev"], committed_plans["dev"]).endswith("No changes.\n")


def test_plan_and_config_check_read_the_current_directory_like_pulumi(tmp_path):
    root = _broken_root(tmp_path, **{"ragpool:vpcCidr": "10.0.0.0/33"})
    for args in (("config", "check", "--stack", "dev"), ("plan", "--stack", "dev")):
        res = run(*args, cwd=root)  # the stack file here, not the repo's, is read
        assert res.returncode == 2 and "ragpool:vpcCidr" in res.stderr, res.stderr
        res = run(*args, "--root", str(REPO_ROOT), cwd=root)  # --root still overrides
        assert res.returncode == 0, res.stderr
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    res = run("config", "check", "--stack", "dev", cwd=empty)
    assert res.returncode == 2 and "no Pulumi.yaml in" in res.stderr and "--root" in res.stderr
    assert "Traceback" not in res.stderr


def test_config_the_program_refuses_is_exit_2_not_a_traceback(tmp_path):
    """If validation ever lets through what the program's own parse refuses, the program's
    RunError is still reported as bad config (exit 2, one message), not a traceback."""
    root = _broken_root(tmp_path, **{"ragpool:gpuPools": None})
    script = ("import sys, infra.plan as p; p.validate_stack = lambda settings: None; "
              "from infra.cli import main; sys.exit(main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", script, "plan", "--stack", "dev", "--root", str(root),
                          "--out", str(tmp_path / "plan.json")], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "ragpool:gpuPools = null" in res.stderr
    assert not (tmp_path / "plan.json").exists()
