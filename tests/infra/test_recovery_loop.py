"""The closed recovery loop, link by link, against upstream behaviour (infra/reference/gpu_fault_repair.yaml).

- detect/fence/replace: every critical GPU alert maps to the node condition the EKS node
  monitoring agent sets for the same fault and to the Karpenter repair that follows; the device
  plugin's health checks are on and fence the GPU; the runbook says what happens by itself and
  what a person does (including the codes nothing repairs);
- the pre-flight health check: the worker Job runs it, and its exit code fails the Job (Kubernetes
  podFailurePolicy semantics) instead of retrying on the same node.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dashboards import rulefiles
from tests.conftest import STACKS
from contract import exit_codes
from contract.env import EXPECTED_GPUS_ENV
from contract.env import NODE_NAME_ENV
from training.scheduler.worker.settings import WorkerConfig, build_arg_parser

REPO = Path(__file__).resolve().parents[2]
REFERENCE = yaml.safe_load((REPO / "infra" / "reference" / "gpu_fault_repair.yaml").read_text())
RUNBOOK = (REPO / "dashboards" / "RUNBOOK.md").read_text()


# ------------------------------------------------------------------ detect -> condition -> repair


def _alerts() -> dict[str, rulefiles.Rule]:
    return {a.name: a for a in rulefiles.alerts() if a.file.name == "gpu.yaml"}


def critical_xids() -> list[int]:
    expr = _alerts()["GpuXidErrorCritical"].expr
    [codes] = re.findall(r'xid=~"([0-9|]+)"', expr)
    return [int(c) for c in codes.split("|")]


def agent_reason(xid: int) -> tuple[str, str]:
    """(reason, severity) the node monitoring agent reports for an XID (handleXidFinding)."""
    agent = REFERENCE["node_monitoring_agent"]
    if xid in agent["fatal_xids"]:
        return agent["xid_reason_fatal"].format(xid=xid), "Fatal"
    return agent["xid_reason_warning"].format(xid=xid), "Warning"


def reason_severity(reason: str) -> str:
    agent = REFERENCE["node_monitoring_agent"]
    match = re.fullmatch(r"NvidiaXID(\d+)(Error|Warning)", reason)
    if match:
        return agent_reason(int(match.group(1)))[1]
    return agent["reasons"][reason]["severity"]


def repair_after_minutes(condition: str, status: str) -> int | None:
    """Karpenter's toleration before it replaces a node in this condition (None: never)."""
    for policy in REFERENCE["karpenter_node_repair"]["policies"]:
        if policy["condition"] == condition and policy["status"] == status:
            return policy["toleration_minutes"]
    return None


def loop_for_reason(reason: str) -> dict | None:
    """What follows from an agent reason: the node condition and Karpenter's repair, or None."""
    if reason_severity(reason) != "Fatal":
        return None  # a Kubernetes event only: no condition, no repair
    condition = REFERENCE["node_monitoring_agent"]["condition"]
    minutes = repair_after_minutes(condition, "False")
    return None if minutes is None else {"condition": condition, "status": "False", "repair_after_minutes": minutes}


def _runbook_section(alert: str) -> str:
    match = re.search(rf"^## {alert}\n(.*?)(?=^## |\Z)", RUNBOOK, re.S | re.M)
    assert match, f"no runbook section for {alert}"
    return match.group(1)


def _paragraph(section: str, title: str) -> str:
    match = re.search(rf"\*\*{title}\*\*(.*?)(?=\n\*\*|\Z)", section, re.S)
    return match.group(1) if match else ""


def test_every_critical_gpu_alert_is_tied_to_the_recovery_loop():
    critical = {name for name, a in _alerts().items() if a.body["labels"]["severity"] == "critical"}
    assert critical == set(REFERENCE["alerts"]), "a critical GPU alert without its place in the loop (or a stale one)"


def test_each_critical_xid_maps_to_a_condition_and_a_repair_or_is_documented_as_manual():
    section = _runbook_section("GpuXidErrorCritical")
    automatic, person = _paragraph(section, r"Automatically\."), _paragraph(section, r"What a person does\.")
    manual = []
    for xid in critical_xids():
        reason, _severity = agent_reason(xid)
        loop = loop_for_reason(reason)
        # The device plugin fences every one of them (none is an application XID it ignores).
        assert xid not in REFERENCE["nvidia_device_plugin"]["always_ignored_xids"], xid
        if loop is None:
            manual.append(xid)
            assert re.search(rf"\b{xid}\b", person), f"XID {xid} is not repaired automatically; the runbook must say so"
        else:
            assert loop == {"condition": "AcceleratedHardwareReady", "status": "False", "repair_after_minutes": 10}
    assert manual == [61]  # today's facts: XID 61 is a Warning for the agent
    assert "AcceleratedHardwareReady=False" in automatic and "10 minutes" in automatic
    assert "except 61" in automatic


@pytest.mark.parametrize("alert", ["GpuEccDoubleBitError", "GpuFellOffBus", "GpuRowRemapFailure"])
def test_ecc_and_bus_alerts_lead_to_a_repair_the_runbook_names(alert):
    reasons = REFERENCE["alerts"][alert]["reasons"]
    loops = [loop_for_reason(r) for r in reasons]
    assert all(loop and loop["repair_after_minutes"] == 10 for loop in loops), (alert, reasons)
    automatic = _paragraph(_runbook_section(alert), r"Automatically\.")
    assert "AcceleratedHardwareReady=False" in automatic and "10" in automatic
    for reason in reasons:
        assert f"`{reason}`" in automatic, (alert, reason)


def test_the_runbook_lists_karpenters_repair_conditions_as_upstream_has_them():
    match = re.search(r"### The recovery loop.*?(?=\n## )", RUNBOOK, re.S)
    assert match, "RUNBOOK.md lost its recovery-loop overview"
    rows = re.findall(r"^\s*\| `(\w+)` \| `(\w+)` \| (\d+) minutes \|$", match.group(0), re.M)
    listed = {(c, s, int(m)) for c, s, m in rows}
    upstream = {(p["condition"], p["status"], p["toleration_minutes"])
                for p in REFERENCE["karpenter_node_repair"]["policies"]}
    assert listed == upstream
    assert "20%" in match.group(0) and REFERENCE["karpenter_node_repair"]["unhealthy_nodepool_share_limit"] == 0.2


def test_a_warning_reason_has_no_repair():
    assert loop_for_reason("NvidiaXID13Warning") is None
    assert loop_for_reason("NvidiaPageRetirement") is None
    assert repair_after_minutes("AcceleratedHardwareReady", "Unknown") is None


def _release_values(plan: dict, chart: str) -> dict:
    [rel] = [r for r in plan["resources"]
             if r["type"] == "kubernetes:helm.sh/v3:Release" and r["inputs"]["chart"].endswith(chart)]
    return rel["inputs"]["values"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_plan_turns_every_link_on(committed_plans, stack):
    plan = committed_plans[stack]
    karpenter = _release_values(plan, "karpenter")
    assert karpenter["settings"]["featureGates"][REFERENCE["karpenter_node_repair"]["feature_gate"]] is True
    addons = {r["inputs"]["addonName"] for r in plan["resources"] if r["type"] == "aws:eks/addon:Addon"}
    assert "eks-node-monitoring-agent" in addons
    plugin = _release_values(plan, "nvidia-device-plugin")
    dp = REFERENCE["nvidia_device_plugin"]
    assert plugin[dp["fail_on_init_error_value"]] is True
    # Nothing in the plan turns the health checks off (no chart value sets it; an env override would).
    text = json.dumps(plan)
    assert dp["disable_env"] not in text


# ------------------------------------------------------------------ the pre-flight check in the Job


def job_failure_action(policy: dict, exit_codes_by_container: dict[str, int], conditions: list[dict] = ()) -> str:
    """Kubernetes' podFailurePolicy: the first matching rule's action, else the default (Count).

    onExitCodes looks only at containers that terminated with a non-zero code (optionally only
    ``containerName``); In/NotIn over ``values``. onPodConditions matches a condition of the same
    type and status (status defaults to True)."""
    for rule in policy["rules"]:
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            codes = [code for name, code in exit_codes_by_container.items()
                     if code != 0 and req.get("containerName") in (None, name)]
            matched = any((code in req["values"]) == (req["operator"] == "In") for code in codes)
        else:
            matched = any(p["type"] == c["type"] and p.get("status", "True") == c["status"]
                          for p in rule["onPodConditions"] for c in conditions)
        if matched:
            return rule["action"]
    return "Count"


def test_the_policy_evaluator_on_the_kubernetes_docs_example():
    policy = {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]}
    assert job_failure_action(policy, {"main": 42}) == "FailJob"
    assert job_failure_action(policy, {"main": 1}) == "Count"
    assert job_failure_action(policy, {"sidecar": 42}) == "Count"
    assert job_failure_action(policy, {"main": 137}, [{"type": "DisruptionTarget", "status": "True"}]) == "Ignore"


def _worker_templates(plan: dict):
    for r in plan["resources"]:
        if r["type"] == "kubernetes:batch/v1:CronJob" and "nvidia.com/gpu" in json.dumps(r["inputs"]):
            yield r["name"], r["inputs"]["spec"]["jobTemplate"]["spec"]


@pytest.mark.parametrize("stack", STACKS)
def test_a_failed_health_check_fails_the_worker_job_instead_of_retrying(committed_plans, stack):
    templates = list(_worker_templates(committed_plans[stack]))
    assert templates
    for name, job in templates:
        policy = job["podFailurePolicy"]
        assert job_failure_action(policy, {"worker": exit_codes.HEALTH_CHECK_FAILED}) == "FailJob", name
        # ... and only that code and bad input do; a checkpointed hand-back is still retried.
        assert job_failure_action(policy, {"worker": exit_codes.RETRIABLE}) == "Count", name
        assert job_failure_action(policy, {"worker": exit_codes.FAILED}) == "Count", name


@pytest.mark.parametrize("stack", STACKS)
def test_the_worker_job_runs_the_check_with_what_it_requested(committed_plans, stack):
    for name, job in _worker_templates(committed_plans[stack]):
        [container] = job["template"]["spec"]["containers"]
        args = build_arg_parser().parse_args(container["args"])  # the worker accepts the Job's flags
        assert args.health_check_timeout_seconds > 0, name
        assert args.lease_seconds == WorkerConfig.lease_seconds, name  # the documented default, one home
        env = {e["name"]: e for e in container["env"]}
        assert env[EXPECTED_GPUS_ENV]["value"] == container["resources"]["requests"]["nvidia.com/gpu"], name
        assert env[NODE_NAME_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", name
