"""CRD validation rules (``x-kubernetes-validations``, CEL) evaluated offline, as the API server
does on create: the object is defaulted from its structural schema first, then every rule is
evaluated with ``self`` bound to each value present at the rule's schema node (each item of an
array, each value of a map). A rule that is false, or errors at run time, rejects the object.

CEL implementation: cel-python (``celpy``, PyPI ``cel-python``), with the two Kubernetes CEL
library functions the pinned CRDs use and celpy lacks: ``<string>.split(<sep>)`` (Kubernetes
strings extension) and ``<string>.find(<regex>)`` (Kubernetes regex library: the first match, or
""). ``validate`` evaluates every rule but the transition rules (they read ``oldSelf``: only an
update has one); ``validate_update`` evaluates those between an object's old and new version, at
every value present in both (list items only in ``x-kubernetes-list-type: map`` lists, matched by
their keys), as the API server does on update. Rules calling a function this evaluator does not
provide are listed by name by ``rule_inventory``, never skipped silently.

Pinned CRDs: the CRDs the repository vendors and applies itself (infra/crds/**: KubeRay's, KEDA's),
else the upstream originals in vendor/upstream/crds/*/original/ (README there). The karpenter.sh
NodePool is the copy the AWS chart installs (karpenter-provider-aws), which adds two rules on
``karpenter.k8s.aws/*`` keys.

The PR plan-diff job (.ci/plan-diff.sh) runs the transition rules between a stack's plan at the
PR's base and at its head (``transition_failures``), from the command line:

    python -m policy.cel_eval transitions base-dev.json head-dev.json

Exit 0: every transition rule holds; 1: violations, one line each naming the resource, the path
and the rule; 2: a plan file that cannot be read (no traceback).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

import celpy
import celpy.evaluation
import yaml
from celpy import celtypes

from scripts.vendor_schemas import REPO_ROOT, YAML_LOADER, VENDOR_DIR as SCHEMAS_DIR
from contract import exit_codes

VENDORED_CRDS = REPO_ROOT / "infra" / "crds"

# One CRD file per group/kind: the copy the cluster installs.
CRD_FILES = {
    ("karpenter.sh", "NodePool"): "karpenter.sh/original/karpenter.sh_nodepools.karpenter-provider-aws.yaml",
    ("karpenter.k8s.aws", "EC2NodeClass"): "karpenter.k8s.aws/original/karpenter.k8s.aws_ec2nodeclasses.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com/original/monitoring.coreos.com_prometheusrules.yaml",
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com/original/monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com", "PodMonitor"): "monitoring.coreos.com/original/monitoring.coreos.com_podmonitors.yaml",
    # The Kueue kinds infra/kueue_objects.py declares (the chart installs them; vendor/upstream/README.md).
    **{("kueue.x-k8s.io", kind): f"kueue.x-k8s.io/original/kueue.x-k8s.io_{plural}.yaml" for kind, plural in (
        ("ResourceFlavor", "resourceflavors"), ("Cohort", "cohorts"), ("ClusterQueue", "clusterqueues"),
        ("LocalQueue", "localqueues"), ("WorkloadPriorityClass", "workloadpriorityclasses"))},
}
MACROS = {"has", "all", "exists", "exists_one", "map", "filter"}


@lru_cache(maxsize=None)
def crd_documents() -> dict[tuple[str, str], tuple[str, dict]]:
    """(group, kind) -> (source file, CRD document)."""
    out = {key: (str((SCHEMAS_DIR / "crds" / file).relative_to(REPO_ROOT)),
                 yaml.load((SCHEMAS_DIR / "crds" / file).read_text(), Loader=YAML_LOADER))
           for key, file in CRD_FILES.items()}
    for path in sorted(VENDORED_CRDS.rglob("*.yaml")) if VENDORED_CRDS.is_dir() else []:
        for doc in yaml.load_all(path.read_text(), Loader=YAML_LOADER):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                key = (doc["spec"]["group"], doc["spec"]["names"]["kind"])
                out[key] = (str(path.relative_to(REPO_ROOT)), doc)
    return out


def _split(value: Any, sep: Any) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(s) for s in str(value).split(str(sep))])


def _find(value: Any, pattern: Any) -> celtypes.StringType:
    match = re.search(str(pattern), str(value))
    return celtypes.StringType(match.group(0) if match else "")


KUBERNETES_FUNCTIONS = {"split": _split, "find": _find}
SUPPORTED_FUNCTIONS = (MACROS | set(KUBERNETES_FUNCTIONS)
                       | {name for name in celpy.evaluation.base_functions if name[0].isalpha()})


@dataclass(frozen=True)
class Rule:
    crd: str       # group/Kind
    version: str
    path: str      # schema path: .spec.template.spec.requirements[].key ({} for a map's values)
    rule: str
    message: str

    @property
    def name(self) -> str:
        return f"{self.crd} {self.version} {self.path or '.'}: {self.rule}"

    @property
    def transition(self) -> bool:
        return re.search(r"\boldSelf\b", self.rule) is not None


def crd_schema(group: str, kind: str, version: str) -> dict:
    _, doc = crd_documents()[(group, kind)]
    [ver] = [v for v in doc["spec"]["versions"] if v["name"] == version]
    return ver["schema"]["openAPIV3Schema"]


def rules_of(schema: dict, crd: str, version: str, path: str = "") -> Iterator[Rule]:
    for r in schema.get("x-kubernetes-validations") or []:
        yield Rule(crd, version, path, r["rule"], r.get("message") or r.get("messageExpression") or r["rule"])
    for key, sub in (schema.get("properties") or {}).items():
        yield from rules_of(sub, crd, version, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from rules_of(schema["items"], crd, version, f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules_of(schema["additionalProperties"], crd, version, path + "{}")


def functions_called(rule: str) -> set[str]:
    tree = celpy.Environment().compile(rule)
    names = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg":
            names.add(str(node.children[1]))
        elif node.data == "ident_arg":
            names.add(str(node.children[0]))
    return names


def rule_inventory() -> dict[str, list[Rule]]:
    """Every rule of every pinned CRD (served versions): evaluable, transition, unsupported."""
    out: dict[str, list[Rule]] = {"evaluable": [], "transition": [], "unsupported": []}
    for (group, kind), (_, doc) in crd_documents().items():
        for version in doc["spec"]["versions"]:
            if not version.get("served"):
                continue
            for rule in rules_of(version["schema"]["openAPIV3Schema"], f"{group}/{kind}", version["name"]):
                if rule.transition:
                    out["transition"].append(rule)
                elif functions_called(rule.rule) - SUPPORTED_FUNCTIONS:
                    out["unsupported"].append(rule)
                else:
                    out["evaluable"].append(rule)
    return out


def apply_defaults(value: Any, schema: dict) -> Any:
    """Structural defaulting (apiextensions: a missing property with a ``default`` gets it, and
    defaulting continues inside it)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            if key in props:
                value[key] = apply_defaults(item, props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                value[key] = apply_defaults(item, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


@lru_cache(maxsize=None)
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=KUBERNETES_FUNCTIONS)


def _evaluate(rule: str, value: Any, old: Any = None) -> tuple[bool, str | None]:
    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    try:
        result = _program(rule).evaluate(activation)
    except celpy.CELEvalError as err:
        return False, f"evaluation error: {err.args[0] if err.args else err}"
    if isinstance(result, celpy.CELEvalError):
        return False, f"evaluation error: {result.args[0] if result.args else result}"
    return bool(result), None


def _violations(value: Any, schema: dict, crd: str, version: str, path: str, where: str,
                skipped: set[str], evaluated: list[str]) -> Iterator[str]:
    if value is None:
        return
    for r in schema.get("x-kubernetes-validations") or []:
        rule = Rule(crd, version, path, r["rule"], r.get("message") or r["rule"])
        if rule.transition or functions_called(rule.rule) - SUPPORTED_FUNCTIONS:
            skipped.add(rule.name)
            continue
        evaluated.append(rule.name)
        ok, error = _evaluate(rule.rule, value)
        if not ok:
            yield f"{where or '.'}: {error or rule.message} (rule: {rule.rule})"
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                yield from _violations(value[key], sub, crd, version, f"{path}.{key}", f"{where}.{key}", skipped, evaluated)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                if key not in (schema.get("properties") or {}):
                    yield from _violations(item, extra, crd, version, path + "{}", f"{where}[{key!r}]", skipped, evaluated)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _violations(item, schema["items"], crd, version, f"{path}[]", f"{where}[{i}]", skipped, evaluated)


@dataclass
class Result:
    violations: list[str]
    evaluated: list[str]   # names of the rules evaluated (once per value they applied to)
    skipped: set[str]      # names of the rules that applied but were not evaluated


def validate(obj: dict) -> Result:
    """Every CEL rule of the object's CRD on the object, after defaulting."""
    group, version = obj["apiVersion"].split("/")
    schema = crd_schema(group, obj["kind"], version)
    skipped: set[str] = set()
    evaluated: list[str] = []
    defaulted = apply_defaults(copy.deepcopy(obj), schema)
    violations = list(_violations(defaulted, schema, f"{group}/{obj['kind']}", version, "", "", skipped, evaluated))
    return Result(violations, evaluated, skipped)


def has_crd(obj: dict) -> bool:
    api = obj.get("apiVersion", "")
    return "/" in api and (api.split("/")[0], obj.get("kind")) in crd_documents()


def _transition_violations(old: Any, new: Any, schema: dict, crd: str, version: str, path: str, where: str,
                           evaluated: list[str]) -> Iterator[str]:
    if old is None or new is None:
        return
    for r in schema.get("x-kubernetes-validations") or []:
        rule = Rule(crd, version, path, r["rule"], r.get("message") or r["rule"])
        if not rule.transition:
            continue
        evaluated.append(rule.name)
        ok, error = _evaluate(rule.rule, new, old)
        if not ok:
            yield f"{where or '.'}: {error or rule.message} (rule: {rule.rule})"
    props = schema.get("properties") or {}
    if isinstance(old, dict) and isinstance(new, dict):
        for key, sub in props.items():
            yield from _transition_violations(old.get(key), new.get(key), sub, crd, version, f"{path}.{key}",
                                              f"{where}.{key}", evaluated)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in new.keys() - props.keys():
                yield from _transition_violations(old.get(key), new[key], extra, crd, version, path + "{}",
                                                  f"{where}[{key!r}]", evaluated)
    elif isinstance(old, list) and isinstance(new, list) and isinstance(schema.get("items"), dict) \
            and schema.get("x-kubernetes-list-type") == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        before = {tuple(item.get(k) for k in keys): item for item in old if isinstance(item, dict)}
        for i, item in enumerate(new):
            match = before.get(tuple(item.get(k) for k in keys)) if isinstance(item, dict) else None
            yield from _transition_violations(match, item, schema["items"], crd, version, f"{path}[]",
                                              f"{where}[{i}]", evaluated)


def validate_update(old: dict, new: dict) -> Result:
    """The transition rules of the object's CRD on an update from ``old`` to ``new`` (both defaulted)."""
    group, version = new["apiVersion"].split("/")
    schema = crd_schema(group, new["kind"], version)
    evaluated: list[str] = []
    old_d, new_d = (apply_defaults(copy.deepcopy(o), schema) for o in (old, new))
    violations = list(_transition_violations(old_d, new_d, schema, f"{group}/{new['kind']}", version, "", "",
                                             evaluated))
    return Result(violations, evaluated, set())


# ------------------------------------------------------------------ plans: base -> head


def custom_resources(plan: dict) -> Iterator[tuple[dict, dict]]:
    """(plan resource, object) for every object of a ``ragpool plan --format json`` document whose
    CRD this module knows (the custom resources; built-in kinds have no CEL rules here)."""
    for r in plan.get("resources") or []:
        obj = r.get("inputs")
        if r.get("type", "").startswith("kubernetes:") and isinstance(obj, dict) and has_crd(obj):
            yield r, obj


def transition_failures(base: dict, head: dict) -> list[str]:
    """The transition rules on every custom resource present in both plans (matched by type and
    name): one line per violation, ``<Kind> <name><path>: <message> (rule: <rule>)``."""
    before = {(r["type"], r["name"]): obj for r, obj in custom_resources(base)}
    failures = []
    for r, obj in custom_resources(head):
        old = before.get((r["type"], r["name"]))
        if old is not None:
            failures += [f"{obj['kind']} {r['name']}{v}" for v in validate_update(old, obj).violations]
    return failures


def _read_plan(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read plan {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("resources"), list):
        raise ValueError(f"{path} is not a `ragpool plan --format json` document (no resources list)")
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.cel_eval",
                                     description="CRD transition rules (oldSelf) between two offline plans")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("transitions", help="evaluate every transition rule from BASE to HEAD")
    t.add_argument("base", help="plan JSON at the PR's base")
    t.add_argument("head", help="plan JSON at the PR's head")
    args = parser.parse_args(argv)
    try:
        base, head = _read_plan(args.base), _read_plan(args.head)
    except ValueError as exc:
        print(f"policy.cel_eval: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    failures = transition_failures(base, head)
    for line in failures:
        print(line)
    shared = len({(r["type"], r["name"]) for r, _ in custom_resources(base)}
                 & {(r["type"], r["name"]) for r, _ in custom_resources(head)})
    print(f"CRD transition rules: {len(failures)} violation(s) on {shared} custom resource(s) in both plans")
    return exit_codes.FAILED if failures else exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
