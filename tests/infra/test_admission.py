"""Admission simulation: every pod template in each plan, through every mutating webhook known
to be active from the pinned add-ons and charts, must still pass its namespace's Pod Security
level.

The webhooks come from the CloudWatch Observability add-on's operator (infra/log_shipping.py;
facts in infra/reference/cloudwatch_observability.yaml ``webhooks``, with the operator's source):

- the workload webhook annotates a Deployment/StatefulSet/DaemonSet's pod template with
  ``instrumentation.opentelemetry.io/inject-<language>`` when Application Signals auto-monitoring
  is on, the namespace is not on the operator's excluded list, and a Service of the namespace
  selects the template's labels;
- the pod webhook then adds an init container per annotated language, with no securityContext.

The add-on's effective values are its recorded chart defaults with the plan's
``configurationValues`` merged over them (as EKS renders the chart). No other pinned chart
installs a webhook that mutates pods: Karpenter v1 has none, kube-prometheus-stack's
admission webhook only handles PrometheusRules, KubeRay's webhook is off by default (not
modelled: a chart that turns one on must be added to the reference data first).

Pod templates: the Kubernetes workloads the plan declares, the RayCluster head and worker
templates, and the Helm charts' workloads a Service of the chart selects (recorded per chart;
their pod spec is not rendered here, so they may only live in a namespace at level privileged).
Pod Security: the namespace's ``pod-security.kubernetes.io/enforce`` label, ``privileged`` when
unlabelled (Kubernetes' default without an AdmissionConfiguration, as on EKS); ``restricted`` is
checked with infra/pod_security.py's restricted context (ragpool's, stricter than the standard by
a read-only root filesystem) plus the pod-level rules of the Kubernetes Pod Security Standards;
``baseline`` is not modelled and fails loudly if a namespace asks for it.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.log_shipping import ADDON, ADDON_CONFIGURATION
from infra.stack import load_stack
from infra.pod_security import restricted_problems
from policy.pod_templates import POD_SPEC_PATHS
from tests.conftest import STACKS
from tests.infra.conftest import DATA_ON_DEV
from tests.support.data_import import with_import_jobs
from tests.support.helm import HELM, helm_merge
from tests.support.kuberay import RAYCLUSTER

REFERENCE = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "infra" / "reference" / "cloudwatch_observability.yaml").read_text())
WEBHOOKS = REFERENCE["webhooks"]
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
SERVICE_TYPE = "kubernetes:core/v1:Service"
ADDON_TYPE = "aws:eks/addon:Addon"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")  # what the workload webhook mutates
# Kubernetes Pod Security Standards, restricted: the only volume types allowed.
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}


# ------------------------------------------------------------------ the add-on's effective values


def addon_values(plan: dict) -> dict:
    """The add-on's chart defaults with the plan's configuration values merged over them."""
    [entry] = [r for r in plan["resources"] if r["type"] == ADDON_TYPE and r["inputs"]["addonName"] == ADDON]
    raw = entry["inputs"].get("configurationValues")
    return helm_merge(REFERENCE["defaults"], json.loads(raw) if raw else {})


def _agent_has_application_signals(agent: dict) -> bool:
    config = agent.get("config")
    if config in (None, "default", "default:otel"):
        return True  # the default config is built with Application Signals when it targets this agent
    return "application_signals" in ((config.get("logs") or {}).get("metrics_collected") or {}) or \
        "application_signals" in ((config.get("traces") or {}).get("traces_collected") or {})


def monitor_all_services(values: dict, region: str) -> bool:
    """The chart helper manager.modify-auto-monitor-config, as the operator receives it."""
    auto = values["manager"]["applicationSignals"]["autoMonitor"]
    signals = values["applicationSignals"]
    has_signals = signals["enabled"] and any(
        a.get("name") == signals["targetAgent"] and _agent_has_application_signals(a) for a in values["agents"])
    if not has_signals and REFERENCE["monitor_all_services"]["forced_false_without_application_signals"]:
        return False
    if "monitorAllServices" in auto:
        return bool(auto["monitorAllServices"])
    return re.search(REFERENCE["monitor_all_services"]["off_in_regions_regex"], region) is None


def test_auto_monitoring_follows_the_chart_helper():
    defaults = helm_merge(REFERENCE["defaults"], {})
    assert monitor_all_services(defaults, "us-west-2") is True
    assert monitor_all_services(defaults, "cn-north-1") is False
    assert monitor_all_services(helm_merge(defaults, {"applicationSignals": {"enabled": False}}), "us-west-2") is False
    explicit_off = {"manager": {"applicationSignals": {"autoMonitor": {"monitorAllServices": False}}}}
    assert monitor_all_services(helm_merge(defaults, explicit_off), "us-west-2") is False


# ------------------------------------------------------------------ pod templates


@dataclass
class PodTemplate:
    source: str           # plan resource name (or chart/workload)
    kind: str
    namespace: str
    labels: dict
    annotations: dict
    spec: dict | None     # None: a chart's pod that is not rendered here
    selected_by_service: bool = False
    injected: list[str] = field(default_factory=list)


def _get(obj: Any, *path: str) -> Any:
    for step in path:
        obj = (obj or {}).get(step)
    return obj


def pod_templates(plan: dict) -> list[PodTemplate]:
    services = [(r["inputs"]["metadata"].get("namespace"), r["inputs"]["spec"].get("selector") or {})
                for r in plan["resources"] if r["type"] == SERVICE_TYPE]
    out = []
    for r in plan["resources"]:
        path = POD_SPEC_PATHS.get(r["type"])
        if path is None:
            continue
        meta = _get(r["inputs"], *path[:-1], "metadata") or {}
        namespace = r["inputs"]["metadata"].get("namespace") or "default"
        labels = meta.get("labels") or {}
        selected = any(ns == namespace and selector and selector.items() <= labels.items() for ns, selector in services)
        out.append(PodTemplate(r["name"], r["type"].rsplit(":", 1)[1], namespace, dict(labels),
                               dict(meta.get("annotations") or {}), copy.deepcopy(_get(r["inputs"], *path)), selected))
    for r in plan["resources"]:
        if r["type"] != RAYCLUSTER:
            continue
        spec = r["inputs"]["spec"]
        groups = [("head", spec["headGroupSpec"]["template"])] + [
            (g["groupName"], g["template"]) for g in spec.get("workerGroupSpecs", [])]
        for group, template in groups:
            meta = template.get("metadata") or {}
            # KubeRay creates these pods itself: no Deployment/StatefulSet/DaemonSet to annotate.
            out.append(PodTemplate(f"{r['name']}/{group}", "RayClusterPod", r["inputs"]["metadata"]["namespace"],
                                   dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}),
                                   copy.deepcopy(template["spec"])))
    recorded = REFERENCE["chart_workloads_selected_by_a_service"]
    for r in plan["resources"]:
        if r["type"] != HELM:
            continue
        chart = r["inputs"]["chart"].rsplit("/", 1)[-1]
        for workload in recorded.get(chart, []):
            spec = _rendered_pod_security(plan, chart, workload["pod_security"]) if "pod_security" in workload else None
            out.append(PodTemplate(f"{chart}/{workload['kind']}", workload["kind"], r["inputs"]["namespace"],
                                   {}, {}, spec, selected_by_service=True))
    return out


def _rendered_pod_security(plan: dict, chart: str, fields: dict) -> dict:
    """A recorded chart workload's pod spec, Pod Security fields only: each the value at its recorded path of the
    release's effective values (the chart's defaults under the plan's), as the chart's template renders it."""
    from tests.support.helm import chart_values

    values = chart_values(plan, chart)

    def at(path: str) -> Any:
        return _get(values, *path.split("."))

    # No hostNetwork path: the chart's template never renders the field.
    return {"hostNetwork": bool(at(fields["hostNetwork"])) if "hostNetwork" in fields else False, "securityContext": at(fields["securityContext"]) or {},
            "containers": [{"name": name, "securityContext": at(path) or {}} for name, path in fields["containers"].items()],
            "volumes": copy.deepcopy(fields["volumes"])}


def unrecorded_charts_outside_excluded_namespaces(plan: dict) -> list[str]:
    recorded = REFERENCE["chart_workloads_selected_by_a_service"]
    excluded = set(WEBHOOKS["workload"]["excluded_namespaces"])
    return [f"{r['inputs']['chart']} in {r['inputs']['namespace']}" for r in plan["resources"]
            if r["type"] == HELM and r["inputs"]["chart"].rsplit("/", 1)[-1] not in recorded
            and r["inputs"]["namespace"] not in excluded]


# ------------------------------------------------------------------ the webhooks


SELECTOR_KINDS = ("deployments", "daemonsets", "statefulsets")


def _selectors(values: dict) -> dict[str, dict]:
    auto = values["manager"]["applicationSignals"]["autoMonitor"]
    return {"customSelector": auto.get("customSelector") or {}, "exclude": auto.get("exclude") or {},
            "autoAnnotateAutoInstrumentation": values["manager"].get("autoAnnotateAutoInstrumentation") or {}}


def unmodelled_selectors(values: dict) -> list[str]:
    """Per-workload selector entries (namespace/name lists), which this simulation does not model."""
    return [f"{where}.{language}.{kind}: {(selector or {}).get(kind)}"
            for where, languages in _selectors(values).items() for language, selector in languages.items()
            for kind in SELECTOR_KINDS if (selector or {}).get(kind)]


def _languages_for_namespace(selectors: dict, namespace: str) -> set[str]:
    return {language for language, selector in selectors.items() if namespace in (selector or {}).get("namespaces", [])}


def workload_webhook(template: PodTemplate, values: dict, region: str) -> PodTemplate:
    """The inject annotations the operator's webhooks give a pod template: its namespace's, when
    the namespace is selected (mnamespace.kb.io: customSelector, autoAnnotateAutoInstrumentation;
    every pod of the namespace), and a selected workload's own (mworkload.kb.io: auto-monitoring,
    minus `exclude`)."""
    auto = values["manager"]["applicationSignals"]["autoMonitor"]
    selectors = _selectors(values)
    languages = (_languages_for_namespace(selectors["customSelector"], template.namespace)
                 | _languages_for_namespace(selectors["autoAnnotateAutoInstrumentation"], template.namespace))
    if template.kind in WORKLOAD_KINDS:
        if (monitor_all_services(values, region) and template.selected_by_service
                and template.namespace not in WEBHOOKS["workload"]["excluded_namespaces"]):
            languages |= set(auto["languages"])
        languages -= _languages_for_namespace(selectors["exclude"], template.namespace)
    annotations = dict(template.annotations)
    for language in sorted(languages):
        for key, value in WEBHOOKS["workload"]["annotations"].items():
            annotations[key.format(language=language)] = value
    return replace(template, annotations=annotations)


def _skips_injection(spec: dict) -> bool:
    pod = spec.get("securityContext") or {}
    if pod.get("runAsNonRoot") and pod.get("runAsUser") is None:
        return True
    first = (spec.get("containers") or [{}])[0].get("securityContext") or {}
    user = first.get("runAsUser", pod.get("runAsUser"))
    return bool(first.get("runAsNonRoot")) and user is None


def pod_webhook(template: PodTemplate) -> PodTemplate:
    """mpod.kb.io: an init container (no securityContext) per inject-<language> annotation."""
    inject = WEBHOOKS["workload"]["annotations"]
    key_format = next(k for k in inject if k.startswith("instrumentation.opentelemetry.io/"))
    prefix, suffix = key_format.split("{language}")
    languages = [k[len(prefix):len(k) - len(suffix) or None] for k, v in template.annotations.items()
                 if k.startswith(prefix) and k.endswith(suffix) and v == "true"]
    if not languages:
        return template
    if template.spec is None:
        names = [WEBHOOKS["pod"]["init_container"].format(language=lang) for lang in sorted(languages)]
        return replace(template, injected=names)
    spec = copy.deepcopy(template.spec)
    if WEBHOOKS["pod"]["skipped_when_run_as_non_root_without_user"] and _skips_injection(spec):
        return template
    injected = []
    for language in sorted(languages):
        name = WEBHOOKS["pod"]["init_container"].format(language=language)
        init: dict[str, Any] = {"name": name, "image": f"adot-autoinstrumentation-{language}",
                                "command": ["cp", "-r", "/autoinstrumentation/.", f"/otel-auto-instrumentation-{language}"],
                                "volumeMounts": [{"name": name, "mountPath": f"/otel-auto-instrumentation-{language}"}]}
        if WEBHOOKS["pod"]["init_container_security_context"] is not None:
            init["securityContext"] = copy.deepcopy(WEBHOOKS["pod"]["init_container_security_context"])
        spec.setdefault("initContainers", []).append(init)
        spec.setdefault("volumes", []).append({"name": name, "emptyDir": {}})
        injected.append(name)
    return replace(template, spec=spec, injected=injected)


def admitted(plan: dict, region: str) -> list[PodTemplate]:
    values = addon_values(plan)
    return [pod_webhook(workload_webhook(t, values, region)) for t in pod_templates(plan)]


# ------------------------------------------------------------------ Pod Security


def namespace_levels(plan: dict) -> dict[str, str]:
    return {r["inputs"]["metadata"]["name"]: (r["inputs"]["metadata"].get("labels") or {}).get(ENFORCE_LABEL, "privileged")
            for r in plan["resources"] if r["type"] == NAMESPACE_TYPE}


def pod_security_problems(spec: dict | None, level: str) -> list[str]:
    """How a pod spec falls short of a Pod Security level (privileged: never; restricted: the
    restricted context of infra/pod_security.py and the pod-level restricted rules)."""
    if level == "privileged":
        return []
    if level != "restricted":
        raise ValueError(f"Pod Security level {level!r} is not modelled here: add its rules before using it")
    if spec is None:
        return ["the pod spec is not rendered here: it cannot be checked against restricted"]
    pod = spec.get("securityContext") or {}
    problems = [f"{key} is true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume.get('name')!r} is {sorted(kinds)}: not a restricted volume type")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(group) or []:
            ctx = container.get("securityContext") or {}
            where = f"{group[:-1]} {container.get('name')!r}"
            problems += [f"{where}: {p}" for p in restricted_problems(pod, ctx)]
            if ctx.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
                problems.append(f"{where}: runAsNonRoot is not true (container or pod)")
            if ctx.get("runAsUser", pod.get("runAsUser")) == 0:
                problems.append(f"{where}: runAsUser is 0")
            if ctx.get("privileged"):
                problems.append(f"{where}: privileged is true")
            added = set((ctx.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}
            if added:
                problems.append(f"{where}: adds capabilities {sorted(added)}")
            if any(p.get("hostPort") for p in container.get("ports") or []):
                problems.append(f"{where}: uses a hostPort")
    return problems


def admission_failures(plan: dict, region: str) -> list[str]:
    levels = namespace_levels(plan)
    return [f"{t.source} ({t.kind}, namespace {t.namespace}, {levels.get(t.namespace, 'privileged')}): {p}"
            for t in admitted(plan, region)
            for p in pod_security_problems(t.spec, levels.get(t.namespace, "privileged"))]


def _region(stack: str) -> str:
    region = load_stack(stack).region
    assert region, f"Pulumi.{stack}.yaml sets no aws:region: the auto-monitoring default depends on it"
    return region


# ------------------------------------------------------------------ the checks


@pytest.mark.parametrize("stack", STACKS)
def test_every_pod_passes_its_namespace_pod_security_after_the_webhooks(committed_plans, stack):
    plan = committed_plans[stack]
    templates = admitted(plan, _region(stack))
    assert any(t.namespace == "ragpool-training" for t in templates)
    assert namespace_levels(plan)["ragpool-training"] == "restricted"
    assert admission_failures(plan, _region(stack)) == []


@pytest.mark.parametrize("stack", STACKS)
def test_no_webhook_injects_containers_into_ragpool_pods(committed_plans, stack):
    """Not even where the namespace would allow it (the KubeRay operator's, privileged)."""
    injected = [f"{t.source} ({t.namespace}): {t.injected}" for t in admitted(committed_plans[stack], _region(stack)) if t.injected]
    assert injected == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_chart_whose_workloads_are_not_recorded_runs_in_an_excluded_namespace(committed_plans, stack):
    assert unrecorded_charts_outside_excluded_namespaces(committed_plans[stack]) == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_addon_configuration_uses_only_modelled_selectors(committed_plans, stack):
    assert unmodelled_selectors(addon_values(committed_plans[stack])) == []


MUTATING = yaml.safe_load((Path(__file__).resolve().parents[2] / "infra" / "reference" / "mutating_webhooks.yaml").read_text())
POD_RESOURCES = {"pods", "deployments", "daemonsets", "statefulsets", "replicasets", "jobs", "cronjobs", "namespaces"}


@pytest.mark.parametrize("stack", STACKS)
def test_every_chart_and_addon_is_assessed_for_mutating_webhooks(committed_plans, stack):
    """A chart or add-on added to the plan must be looked at (infra/reference/mutating_webhooks.yaml)
    before this simulation can say its pods are admitted."""
    plan = committed_plans[stack]
    charts = {r["inputs"]["chart"].rsplit("/", 1)[-1] for r in plan["resources"] if r["type"] == HELM}
    addons = {r["inputs"]["addonName"] for r in plan["resources"] if r["type"] == ADDON_TYPE}
    assert sorted(charts - set(MUTATING["charts"])) == []
    assert sorted(addons - set(MUTATING["addons"])) == []


def test_only_modelled_webhooks_mutate_pods():
    entries = {**MUTATING["charts"], **MUTATING["addons"]}
    touching = {name for name, entry in entries.items()
                if any(set(w["resources"]) & POD_RESOURCES for w in entry["mutating"])}
    # Kueue's Job webhook: read at the source, it changes no Pod Security field (the reference says why).
    neutral = {name for name, entry in entries.items() if entry.get("pod_security_neutral")}
    assert neutral == {"kueue"} and not neutral & {name for name, entry in entries.items() if entry.get("modelled")}
    assert touching - neutral == {name for name, entry in entries.items() if entry.get("modelled")} == {ADDON}


def _with_addon_configuration(plan: dict, config: dict) -> dict:
    plan = copy.deepcopy(plan)
    for r in plan["resources"]:
        if r["type"] == ADDON_TYPE and r["inputs"]["addonName"] == ADDON:
            r["inputs"]["configurationValues"] = json.dumps(config)
    return plan


def test_the_simulation_sees_the_add_on_defaults_break_the_dev_queue(committed_plans):
    """With the add-on's defaults (Application Signals and auto-monitoring on), the dev Valkey
    StatefulSet, which a Service selects, gets ADOT init containers that restricted rejects, and the
    KubeRay operator gets them too."""
    dev = _with_addon_configuration(committed_plans["dev"], {"containerLogs": {"enabled": True}})
    failures = admission_failures(dev, "us-west-2")
    assert any("(StatefulSet, namespace ragpool-training" in f and "opentelemetry-auto-instrumentation-python" in f
               and "allowPrivilegeEscalation" in f for f in failures), failures
    injected = {t.source: t.injected for t in admitted(dev, "us-west-2") if t.injected}
    assert "kuberay-operator/Deployment" in injected
    # The same plan with ragpool's configuration passes.
    assert admission_failures(_with_addon_configuration(dev, ADDON_CONFIGURATION), "us-west-2") == []


def test_injection_is_skipped_when_run_as_non_root_has_no_user():
    annotations = {"instrumentation.opentelemetry.io/inject-java": "true"}
    no_user = PodTemplate("x", "Deployment", "ns", {}, annotations,
                          {"securityContext": {"runAsNonRoot": True}, "containers": [{"name": "main"}]})
    assert pod_webhook(no_user).injected == []
    with_user = replace(no_user, spec={"securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                                       "containers": [{"name": "main"}]})
    assert pod_webhook(with_user).injected == ["opentelemetry-auto-instrumentation-java"]


def test_the_pod_security_checker():
    from infra.pod_security import container_security_context, pod_security_context

    good = {"securityContext": pod_security_context(1000), "containers": [
        {"name": "main", "securityContext": container_security_context()}], "volumes": [{"name": "t", "emptyDir": {}}]}
    assert pod_security_problems(good, "restricted") == []
    assert pod_security_problems({**good, "hostNetwork": True}, "restricted") == ["hostNetwork is true"]
    host_path = {**good, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    assert pod_security_problems(host_path, "restricted") == ["volume 'h' is ['hostPath']: not a restricted volume type"]
    bare = {**good, "initContainers": [{"name": "init"}]}
    assert any("initContainer 'init': allowPrivilegeEscalation" in p for p in pod_security_problems(bare, "restricted"))
    assert pod_security_problems(bare, "privileged") == []
    with pytest.raises(ValueError, match="baseline"):
        pod_security_problems(good, "baseline")


def test_the_dataset_import_job_passes_restricted_after_the_webhooks(data_plan):
    """The Job ``ragpool data import`` creates (infra/data_access.py ``import_job``), in the main and a team
    namespace, both at level restricted."""
    namespaces = ["ragpool-training", "ragpool-team-search"]
    plan = with_import_jobs(data_plan, namespaces, [b["bucket"] for b in DATA_ON_DEV["ragpool:dataBuckets"]])
    jobs = [t for t in admitted(plan, _region("dev")) if t.source.startswith("data-import-")]
    assert sorted(t.namespace for t in jobs) == sorted(namespaces) and all(t.spec for t in jobs)
    assert all(namespace_levels(plan)[ns] == "restricted" for ns in namespaces)
    assert admission_failures(plan, _region("dev")) == []
