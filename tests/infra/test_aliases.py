"""Renaming or retyping a component keeps every existing resource (no replacements)."""

from __future__ import annotations


import pytest

from infra import aliases
from infra.plan import INFRA_DIR, plan_diff, render_plan, run_program
from infra.stack import load_stack


def _plan_with_main(tmp_path, replace: tuple[str, str] | None):
    program = tmp_path / "program"
    program.mkdir()
    text = (INFRA_DIR / "__main__.py").read_text()
    if replace:
        assert replace[0] in text
        text = text.replace(*replace)
    (program / "__main__.py").write_text(text)
    settings = load_stack("dev")
    return render_plan(settings, run_program(settings, program=program))


@pytest.fixture
def baseline(tmp_path_factory):
    return _plan_with_main(tmp_path_factory.mktemp("base"), None)


def test_renamed_component_keeps_its_children(baseline, tmp_path, monkeypatch):
    monkeypatch.setitem(aliases.MOVES, ("ragpool:infra:SharedStorage", "shared-storage"), aliases.Moved(old_name="storage"))
    renamed = _plan_with_main(tmp_path, ('SharedStorage("storage"', 'SharedStorage("shared-storage"'))
    component = [r for r in renamed["resources"] if r["type"] == "ragpool:infra:SharedStorage"][0]
    assert component["name"] == "shared-storage" and component["aliases"] == ["storage"]
    # Every child keeps its type and name (so its URN): only the component itself is renamed.
    before = {(r["type"], r["name"]): r["inputs"] for r in baseline["resources"] if r["parent"] == "storage"}
    after = {(r["type"], r["name"]): r["inputs"] for r in renamed["resources"] if r["parent"] == "shared-storage"}
    assert before and before == after
    diff = plan_diff(baseline, renamed)
    # The component node is renamed; its children only show their new parent.
    assert "+ ragpool:infra:SharedStorage (1): shared-storage" in diff
    common = [ln for ln in diff.splitlines() if ln.startswith("  ~ ") and "resources)" in ln]
    assert common == [f"  ~ [parent]: storage => shared-storage   ({len(before)} resources)"]
    assert not [ln for ln in diff.splitlines() if ln.startswith("    ")]  # nothing else changes


def test_rename_without_alias_would_replace_children(baseline, tmp_path):
    """Why the alias matters: unrecorded, the rename renames (replaces) every child."""
    renamed = _plan_with_main(tmp_path, ('SharedStorage("storage"', 'SharedStorage("shared-storage"'))
    children = [r["name"] for r in renamed["resources"] if r["parent"] == "shared-storage"]
    assert children and all(n.startswith("shared-storage-") for n in children)


def test_retyped_component_records_old_type(tmp_path, monkeypatch):
    from infra.aliases import Moved

    monkeypatch.setitem(aliases.MOVES, ("ragpool:infra:Registry", "registry"), Moved(old_type="ragpool:infra:Ecr"))
    settings = load_stack("dev")
    recorded = run_program(settings)
    registry = [r for r in recorded if r.type == "ragpool:infra:Registry"][0]
    assert registry.aliases == ["registry (ragpool:infra:Ecr)"]
    # Children inherit the parent's alias in the engine; their own names are unchanged.
    assert {r.name for r in recorded if r.parent_urn.endswith("::registry")} == {"registry-training"}
