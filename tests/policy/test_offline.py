"""The offline evaluator: CLI exit codes, policy config handling, bad input, tag coverage."""

from __future__ import annotations

import importlib
import json

import pytest

from policy.checks import NON_TAGGABLE_AWS_TYPES, RULES, RULES_BY_NAME
from policy.offline import PolicyInputError, evaluate, main, validate_config
from tests.conftest import STACKS
from tests.policy.conftest import find

pytestmark = pytest.mark.infra


def write(tmp_path, name, doc) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_cli_passes_committed_plan_and_shows_advisories(tmp_path, committed_plans, capsys):
    assert main(["--plan", write(tmp_path, "prod.json", committed_plans["prod"])]) == 0
    out = capsys.readouterr().out
    assert "[advisory] gpu-ami-pinned-in-prod" in out
    assert out.strip().endswith("0 mandatory, 3 advisory violation(s)")  # one per GPU pool's EC2NodeClass


def test_cli_fails_on_mandatory_violation_with_json_report(tmp_path, plan_of, capsys):
    doc = plan_of("dev")
    find(doc, "aws:efs/fileSystem:FileSystem")["inputs"]["encrypted"] = False
    assert main(["--plan", write(tmp_path, "dev.json", doc), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["stack"] == "dev"
    assert report["violations"] == [{
        "policy": "efs-encrypted", "enforcement": "mandatory",
        "resource_type": "aws:efs/fileSystem:FileSystem", "resource_name": "storage-efs",
        "message": report["violations"][0]["message"]}]


def test_cli_config_can_downgrade_or_disable(tmp_path, plan_of, capsys):
    doc = plan_of("dev")
    find(doc, "aws:efs/fileSystem:FileSystem")["inputs"]["encrypted"] = False
    plan_file = write(tmp_path, "dev.json", doc)
    advisory = write(tmp_path, "advisory.json", {"efs-encrypted": {"enforcementLevel": "advisory"}})
    assert main(["--plan", plan_file, "--config", advisory]) == 0
    assert "[advisory] efs-encrypted" in capsys.readouterr().out
    disabled = write(tmp_path, "disabled.json", {"all": "disabled"})
    assert main(["--plan", plan_file, "--config", disabled]) == 0
    assert "0 mandatory, 0 advisory" in capsys.readouterr().out


def test_cli_runs_the_program_for_a_stack(capsys):
    assert main(["--stack", "dev"]) == 0
    assert f"policy check dev: {len(RULES)}/{len(RULES)} policies clean" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "not valid JSON"),
    (json.dumps({"resources": "nope"}), "expected {\"stack\", \"resources\""),
    (json.dumps({"stack": "dev", "resources": [{"type": "aws:kms/key:Key"}]}), "resources[0] lacks a string type and name"),
])
def test_cli_rejects_malformed_plans(tmp_path, capsys, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["--plan", str(path)]) == 2
    assert expected in capsys.readouterr().err


def test_cli_missing_files_exit_3(tmp_path, capsys):
    assert main(["--plan", str(tmp_path / "absent.json")]) == 3
    assert "absent.json: no such file" in capsys.readouterr().err


def test_cli_unknown_stack_is_bad_input(capsys):
    assert main(["--stack", "nosuchstack"]) == 2
    assert "Pulumi.nosuchstack.yaml" in capsys.readouterr().err


def test_config_errors_are_all_reported_at_once():
    with pytest.raises(PolicyInputError) as err:
        validate_config({"efs-encryptd": "mandatory",
                         "efs-encrypted": "blocking",
                         "monitoring-no-public-loadbalancer": {"allowPublic": True},
                         "all": 3}, source="cfg.json")
    lines = str(err.value).splitlines()
    assert len(lines) == 4
    assert "cfg.json: unknown policy 'efs-encryptd'" in lines[0]
    assert "enforcementLevel 'blocking' is not one of" in lines[1]
    assert "unknown property 'allowPublic'; allowed: allowPublicLoadBalancer" in lines[2]
    assert "all: expected an enforcement level or an object, got 3" in lines[3]


def test_required_tags_are_configurable(committed_plans):
    config = {"required-cost-tags": {"requiredTags": ["team"]}}
    violations = evaluate(committed_plans["dev"], config, rules=[RULES_BY_NAME["required-cost-tags"]])
    assert violations and all("lack team" in v.message for v in violations)


@pytest.mark.parametrize("stack", STACKS)
def test_non_taggable_list_matches_the_aws_sdk(committed_plans, stack):
    """Every AWS type in the plan is taggable in pulumi_aws exactly when the rule expects tags."""
    for rtype in sorted({e["type"] for e in committed_plans[stack]["resources"] if e["type"].startswith("aws:")}):
        module, cls = rtype.split(":")[1].split("/")[0], rtype.split(":")[2]
        args = getattr(importlib.import_module(f"pulumi_aws.{module}"), f"{cls}Args")
        assert hasattr(args, "tags") == (rtype not in NON_TAGGABLE_AWS_TYPES), rtype
