"""ragpool guardrails: a Pulumi CrossGuard policy pack whose checks also run offline.

- ``policy/checks/``: the rules, plain functions over (type, inputs, protect, stack).
- ``policy/pack.py``: the same rules as ``pulumi_policy`` policies; ``policy/__main__.py``
  serves them when the CLI runs ``pulumi preview --policy-pack policy``.
- ``policy/offline.py``: ``evaluate(plan_doc)`` and ``python -m policy.offline --stack S``
  over the ``ragpool plan`` document.
"""

from policy.checks import ADVISORY, MANDATORY, RULES, RULES_BY_NAME, Context, Resource, Rule

__all__ = ["ADVISORY", "MANDATORY", "RULES", "RULES_BY_NAME", "Context", "Resource", "Rule"]
