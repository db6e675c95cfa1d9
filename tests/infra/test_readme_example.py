"""The operator example (docs/PLAN_DIFF.md, from README "Changing stack config") is real: its config change
produces its plan-diff."""

from __future__ import annotations

import re

import yaml

from infra.plan import plan, plan_diff
from infra.stack import REPO_ROOT


def _block(text: str, marker: str) -> str:
    m = re.search(rf"<!-- {marker} -->\n```[a-z]*\n(.*?)```", text, re.S)
    assert m, f"docs/PLAN_DIFF.md has no {marker} block"
    return m.group(1)


def test_the_plan_diff_example_comes_from_its_config_change(committed_plans):
    readme = (REPO_ROOT / "docs" / "PLAN_DIFF.md").read_text()
    change = yaml.safe_load(_block(readme, "plan-diff-example:config"))
    assert set(change) == {"ragpool:gpuPools", "ragpool:prometheusRetention"}
    after = plan("dev", overrides=change)
    assert _block(readme, "plan-diff-example:diff") == plan_diff(committed_plans["dev"], after)
