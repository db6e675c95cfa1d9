"""infra/common.py: the Helm values files name the system pool and the pool label through tags,
rendered from their one home (SYSTEM_NODE_SELECTOR, training.ray.placement.POOL_LABEL)."""

from __future__ import annotations

import pytest
import yaml

from infra import common
from infra.common import SYSTEM_NODE_SELECTOR, SYSTEM_POOL, VALUES_DIR, load_values
from contract.names import POOL_LABEL

VALUES_FILES = sorted(p.name for p in VALUES_DIR.glob("*.yaml"))


def node_selectors(doc: object) -> list[dict]:
    """Every ``nodeSelector`` mapping anywhere in a values document."""
    if isinstance(doc, dict):
        found = [v for k, v in doc.items() if k == "nodeSelector" and isinstance(v, dict)]
        return found + [s for v in doc.values() for s in node_selectors(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in node_selectors(v)]
    return []


@pytest.mark.parametrize("filename", VALUES_FILES)
def test_no_values_file_writes_the_pool_label(filename):
    text = (VALUES_DIR / filename).read_text()
    assert POOL_LABEL not in text, f"{filename}: use !system-nodes / !pool-label (infra.common.load_values)"


def test_the_system_services_land_on_the_system_nodes():
    """Each nodeSelector the values files ask for renders to the system pool's selector."""
    rendered = {name: node_selectors(load_values(name)) for name in VALUES_FILES}
    # keda, karpenter, kuberay, kueue, opencost, 3 in kps
    assert sum(len(s) for s in rendered.values()) == 8, rendered
    assert rendered["kueue.yaml"] and rendered["opencost.yaml"]
    for name, selectors in rendered.items():
        for selector in selectors:
            assert selector[POOL_LABEL] == SYSTEM_POOL, (name, selector)
    assert rendered["karpenter.yaml"] == [{"kubernetes.io/os": "linux", **SYSTEM_NODE_SELECTOR}]
    # kube-state-metrics' label allow-list is set by infra/monitoring.py (tests/infra/test_monitoring.py).
    assert "kube-state-metrics" not in load_values("kube-prometheus-stack.yaml")


def test_the_tags_follow_their_home(monkeypatch, tmp_path):
    """Rendered, not copied: a changed SYSTEM_NODE_SELECTOR / POOL_LABEL changes what load_values returns."""
    (tmp_path / "x.yaml").write_text('a: !system-nodes {}\nb: !system-nodes {os: linux}\nc: !pool-label "[{pool_label}]"\n')
    monkeypatch.setattr(common, "VALUES_DIR", tmp_path)
    monkeypatch.setattr(common, "SYSTEM_NODE_SELECTOR", {"example.io/pool": "ops"})
    monkeypatch.setattr(common, "POOL_LABEL", "example.io/pool")
    assert load_values("x.yaml") == {"a": {"example.io/pool": "ops"}, "b": {"os": "linux", "example.io/pool": "ops"},
                                     "c": "[example.io/pool]"}


def test_a_plain_yaml_reader_refuses_the_tags():
    """The tags cannot be read past by accident: yaml.safe_load fails on them."""
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.safe_load((VALUES_DIR / "keda.yaml").read_text())
