"""Refresh ``vendor/upstream/``: the upstream CRDs, chart defaults and DCGM counter lists the tests read.

Nothing is downloaded: clone each upstream repository at the pinned tag (``SOURCES``), name the
checkouts, and this copies the files (``FILES``) byte for byte and rebuilds the strict JSON schemas
(``CRD_SCHEMAS``) the way ``vendor/upstream/README.md`` describes. Without checkouts it only rebuilds
the JSON from the CRD YAML already in the repository.

    python scripts/vendor_schemas.py --check          # exit 1 if a vendored JSON schema is stale
    python scripts/vendor_schemas.py                  # rebuild the JSON from the vendored CRD YAML
    python scripts/vendor_schemas.py --checkout K=../karpenter --checkout PO=../prometheus-operator ...

Bumping a pin: edit ``SOURCES`` (and the versions in ``FILES``), the table in the README and the
chart pin in ``infra/charts.py``, then run with the new checkouts. The KubeRay and KEDA CRDs the
program applies are vendored by ``infra/`` itself (``infra/crds/*/README.md``); the JSON made from
them lives here.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
VENDOR_DIR = REPO_ROOT / "vendor" / "upstream"
"""The one folder of vendored upstream data (README there lists every file, with the ones in infra/crds/)."""


@dataclass(frozen=True)
class Source:
    """One upstream repository at a pinned tag."""

    repo: str
    """GitHub owner/name."""
    tag: str
    """The release tag the files come from."""
    commit: str
    """The tag's commit: a checkout must be at it (``git -C <checkout> rev-parse HEAD``)."""


SOURCES: dict[str, Source] = {
    "K": Source("kubernetes-sigs/karpenter", "v1.14.1", "6e7eab7a0f485d7225eb98995fad9b66c79b322b"),
    "KA": Source("aws/karpenter-provider-aws", "v1.14.1", "bde00654cd316fddb3dccfba3f5ac07039865429"),
    "PO": Source("prometheus-operator/prometheus-operator", "v0.93.0", "f8fafd475f3d132e239432ae6172de60a6cb6516"),
    "KR": Source("ray-project/kuberay", "v1.7.0", "59d663aeec13760646da3db9c1cf8cfe883e30b7"),
    "PC1": Source("prometheus-community/helm-charts", "kube-prometheus-stack-88.5.3",
                  "ea930baeebeba39f56d6b44e351f23b2a072a600"),
    "PC2": Source("prometheus-community/helm-charts", "kube-state-metrics-8.4.0",
                  "1982f1c5828920f5d4ea5d04956169e81f8c5129"),
    "PC3": Source("prometheus-community/helm-charts", "prometheus-node-exporter-4.56.1",
                  "8b8e639cac80a3001412f187060068978f649a55"),
    "GC": Source("grafana-community/helm-charts", "grafana-12.11.1", "864f7794683680e5100a38670e103c4fa6e37e29"),
    "DP": Source("NVIDIA/k8s-device-plugin", "v0.20.0", "1b826acc6af3079d8923bac395c3124b8861a9a6"),
    "DE": Source("NVIDIA/dcgm-exporter", "4.5.3-4.8.2", "691c92762eb551313c825f6efe4ceeee20982801"),
    "EFS": Source("kubernetes-sigs/aws-efs-csi-driver", "helm-chart-aws-efs-csi-driver-4.4.1",
                  "3fcc6bdd7533a4cfd15643b31593f7ff154584c9"),
    "KE": Source("kedacore/keda", "v2.20.2", "68a5b5028f35b22d50597c69819ab32c4e92f21a"),
    "KC": Source("kedacore/charts", "v2.20.2", "cbb9bb8ce0809dc9048f72302f7c09765d66ed56"),
    # aws/eks-charts tags no chart release: the commit that last changed the chart (its Chart.yaml version
    # v0.5.30, the version the repository's gh-pages index.yaml publishes).
    "EC": Source("aws/eks-charts", "master (untagged)", "bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec"),
    # The chart (charts/kueue) and the CRDs it renders (charts/kueue/templates/crd/: the same schemas as
    # config/components/crd/bases/, which is what is copied) come from the one repository and tag.
    "KU": Source("kubernetes-sigs/kueue", "v0.19.2", "8eab68778fc1b52affe165fdf5af29d1e9b4f3cb"),
    "OC": Source("opencost/opencost-helm-chart", "opencost-2.5.17", "725bb939d6a631a7b679cef38fe42a3d872efe64"),
}

# The Kueue kinds infra/kueue_objects.py declares (the chart installs every Kueue CRD itself).
KUEUE_CRD_KINDS = ("resourceflavors", "cohorts", "clusterqueues", "localqueues", "workloadpriorityclasses")

_NFD_TGZ = "deployments/helm/nvidia-device-plugin/charts/node-feature-discovery-0.19.0.tgz"

# (source key, path in the upstream checkout, path under VENDOR_DIR). "<tgz>!<member>" reads a
# member of a chart archive in the checkout.
FILES: list[tuple[str, str, str]] = [
    ("K", "pkg/apis/crds/karpenter.sh_nodepools.yaml", "crds/karpenter.sh/original/karpenter.sh_nodepools.yaml"),
    ("KA", "pkg/apis/crds/karpenter.sh_nodepools.yaml",
     "crds/karpenter.sh/original/karpenter.sh_nodepools.karpenter-provider-aws.yaml"),
    ("KA", "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml",
     "crds/karpenter.k8s.aws/original/karpenter.k8s.aws_ec2nodeclasses.yaml"),
    *[("PO", f"example/prometheus-operator-crd/monitoring.coreos.com_{kinds}.yaml",
       f"crds/monitoring.coreos.com/original/monitoring.coreos.com_{kinds}.yaml")
      for kinds in ("prometheusrules", "servicemonitors", "podmonitors")],
    *[(key, f"{src}/{name}", f"helm/{chart}/{version}/{name}")
      for key, src, chart, version in (
          ("PC1", "charts/kube-prometheus-stack", "kube-prometheus-stack", "88.5.3"),
          ("PC2", "charts/kube-state-metrics", "kube-state-metrics", "8.4.0"),
          ("PC3", "charts/prometheus-node-exporter", "prometheus-node-exporter", "4.56.1"),
          ("GC", "charts/grafana", "grafana", "12.11.1"),
          ("DP", "deployments/helm/nvidia-device-plugin", "nvidia-device-plugin", "0.20.0"),
          ("DE", "deployment", "dcgm-exporter", "4.8.2"),
          ("KA", "charts/karpenter", "karpenter", "1.14.1"),
          ("KR", "helm-chart/kuberay-operator", "kuberay-operator", "1.7.0"),
          ("EFS", "charts/aws-efs-csi-driver", "aws-efs-csi-driver", "4.4.1"),
          ("KC", "keda", "keda", "2.20.2"),
          ("EC", "stable/aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", "v0.5.30"),
          ("KU", "charts/kueue", "kueue", "0.19.2"),
          ("OC", "charts/opencost", "opencost", "2.5.17"))
      for name in ("values.yaml", "Chart.yaml")],
    *[("DP", f"{_NFD_TGZ}!node-feature-discovery/{name}", f"helm/node-feature-discovery/0.19.0/{name}")
      for name in ("values.yaml", "Chart.yaml", "values.schema.json")],
    # OpenCost's ClusterRole, to check that it only reads (tests/infra/test_opencost.py).
    ("OC", "charts/opencost/templates/clusterrole.yaml", "helm/opencost/2.5.17/templates/clusterrole.yaml"),
    ("DE", "etc/default-counters.csv", "dcgm/default-counters.csv"),
    ("DE", "etc/dcp-metrics-included.csv", "dcgm/dcp-metrics-included.csv"),
    *[("KU", f"config/components/crd/bases/kueue.x-k8s.io_{kinds}.yaml",
       f"crds/kueue.x-k8s.io/original/kueue.x-k8s.io_{kinds}.yaml") for kinds in KUEUE_CRD_KINDS],
]

# Strict JSON schemas: CRD YAML (relative to the repo root) -> folder under VENDOR_DIR for
# <kind>_<version>.json, one per served version.
CRD_SCHEMAS: list[tuple[str, str]] = [
    ("vendor/upstream/crds/karpenter.sh/original/karpenter.sh_nodepools.yaml", "crds/karpenter.sh"),
    ("vendor/upstream/crds/karpenter.k8s.aws/original/karpenter.k8s.aws_ec2nodeclasses.yaml", "crds/karpenter.k8s.aws"),
    *[(f"vendor/upstream/crds/monitoring.coreos.com/original/monitoring.coreos.com_{kinds}.yaml",
       "crds/monitoring.coreos.com") for kinds in ("prometheusrules", "servicemonitors", "podmonitors")],
    # Applied by the program (infra/crds/kuberay/README.md); the same blobs as the KR tag's
    # ray-operator/config/crd/bases/.
    *[(f"infra/crds/kuberay/ray.io_{kinds}.yaml", "crds/ray.io") for kinds in ("rayclusters", "rayjobs")],
    # Applied by the program (infra/crds/keda/README.md): the KE tag's config/crd/bases/.
    *[(f"infra/crds/keda/keda.sh_{kinds}.yaml", "crds/keda.sh")
      for kinds in ("scaledjobs", "scaledobjects", "triggerauthentications", "clustertriggerauthentications")],
    *[(f"infra/crds/keda/eventing.keda.sh_{kinds}.yaml", "crds/eventing.keda.sh")
      for kinds in ("cloudeventsources", "clustercloudeventsources")],
    *[(f"vendor/upstream/crds/kueue.x-k8s.io/original/kueue.x-k8s.io_{kinds}.yaml", "crds/kueue.x-k8s.io")
      for kinds in KUEUE_CRD_KINDS],
]

# libyaml's loader when PyYAML has it (the same documents, ~10x faster on these multi-MB CRDs): for the upstream
# files this repository vendors (trusted), never for a file a user wrote (training/config/run.py bounds those).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DRAFT4 = "http://json-schema.org/draft-04/schema#"
_COMBINATORS = ("anyOf", "allOf", "oneOf", "not")
# Transformation 4: Go's RE2 takes a flag group after "^"; Python's re wants global flags first.
_PATTERN_REWRITES = {"^(?i)(abort|warn)?$": "(?i)^(abort|warn)?$"}


def strict_schema(schema: Any, *, in_combinator: bool = False) -> Any:
    """An upstream ``openAPIV3Schema`` made strict (README transformations 2-4): ``additionalProperties:
    false`` on every object schema with ``properties`` and neither ``additionalProperties`` nor
    ``x-kubernetes-preserve-unknown-fields: true`` (not inside anyOf/allOf/oneOf/not),
    ``nullable: true`` also as a ``[T, "null"]`` type, RE2-only patterns rewritten for Python's ``re``.
    Key order is kept; ``additionalProperties`` goes last."""
    if isinstance(schema, list):
        return [strict_schema(s, in_combinator=in_combinator) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _COMBINATORS:
            out[key] = strict_schema(value, in_combinator=True)
        elif key == "properties":
            out[key] = {name: strict_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = strict_schema(value)
        elif key == "pattern":
            out[key] = _PATTERN_REWRITES.get(value, value)
        else:
            out[key] = value
    if out.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]  # "nullable" itself stays (draft-04 ignores it)
    if ("properties" in out and not in_combinator and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def strict_crd_schemas(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``<kind>_<version>.json`` -> strict draft-04 JSON schema, for each served version of a CRD."""
    kind = crd["spec"]["names"]["kind"].lower()
    return {f"{kind}_{v['name']}.json": {"$schema": DRAFT4, **strict_schema(v["schema"]["openAPIV3Schema"])}
            for v in crd["spec"]["versions"] if v.get("served", True)}


def schema_text(schema: dict[str, Any]) -> str:
    """How a schema is written: one-space indent, upstream key order, UTF-8, final newline."""
    return json.dumps(schema, indent=1, ensure_ascii=False) + "\n"


@lru_cache(maxsize=None)
def built_schemas(repo_root: Path = REPO_ROOT) -> dict[Path, str]:
    """Every vendored JSON schema (path under VENDOR_DIR) as this script makes it from the CRD YAML
    (cached: the CRD YAML is read once per process)."""
    out: dict[Path, str] = {}
    for crd_path, folder in CRD_SCHEMAS:
        crd = yaml.load((repo_root / crd_path).read_text(encoding="utf-8"), Loader=YAML_LOADER)
        for name, schema in strict_crd_schemas(crd).items():
            out[Path(folder) / name] = schema_text(schema)
    return out


def upstream_bytes(checkout: Path, upstream_path: str) -> bytes:
    """A file of a checkout, or a member of a chart archive in it (``<tgz>!<member>``)."""
    archive, _, member = upstream_path.partition("!")
    data = (checkout / archive).read_bytes()
    if not member:
        return data
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tgz:
        f = tgz.extractfile(member)
        if f is None:
            raise FileNotFoundError(f"{member} is not a file in {checkout / archive}")
        return f.read()


def copy_from_checkouts(checkouts: dict[str, Path], out_dir: Path = VENDOR_DIR) -> list[Path]:
    """Copy every FILES entry whose source is in ``checkouts``; returns the paths written."""
    written = []
    for key, upstream_path, rel in FILES:
        if key in checkouts:
            dest = out_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(upstream_bytes(checkouts[key], upstream_path))
            written.append(dest)
    return written


def _checkout_arg(value: str) -> tuple[str, Path]:
    key, sep, path = value.partition("=")
    if not sep or key not in SOURCES:
        raise argparse.ArgumentTypeError(f"{value!r}: expected KEY=PATH with KEY one of {', '.join(SOURCES)}")
    if not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"{value!r}: {path} is not a directory (a checkout of "
                                         f"{SOURCES[key].repo} at {SOURCES[key].tag})")
    return key, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", type=_checkout_arg, default=[], metavar="KEY=PATH",
                        help="a checkout of SOURCES[KEY] at its pinned tag; its files are copied first")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a JSON schema is stale")
    args = parser.parse_args(argv)
    if args.checkout and args.check:
        parser.error("--check reads the vendored files only; leave out --checkout")
    for path in copy_from_checkouts(dict(args.checkout)):
        print(f"copied {path.relative_to(REPO_ROOT)}")
    stale = []
    for rel, text in built_schemas().items():
        dest = VENDOR_DIR / rel
        if dest.is_file() and dest.read_text(encoding="utf-8") == text:
            continue
        stale.append(rel)
        if not args.check:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
            print(f"wrote {dest.relative_to(REPO_ROOT)}")
    if args.check and stale:
        print("stale (run scripts/vendor_schemas.py): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
