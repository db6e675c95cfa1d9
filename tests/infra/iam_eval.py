"""A minimal offline evaluator of AWS IAM policy documents, for tests.

No maintained offline evaluator is available as a Python package (policyuniverse and
parliament parse and lint, moto's access control ignores conditions, principalmapper's
last release is from 2022-01; @cloud-copilot/iam-simulate is npm), so this module
implements the part of AWS's documented evaluation logic that ragpool's policies use,
and tests/infra/test_iam_eval.py checks it against the examples in AWS's IAM User Guide
("Policy evaluation logic", "Condition operators", "Creating a condition with multiple
keys or values").

Semantics (one account, no SCPs, boundaries or session policies):
- ``evaluate`` returns ``"Deny"`` if any matching statement of any policy denies (an
  explicit deny wins), else ``"Allow"`` if any matching statement allows, else
  ``"ImplicitDeny"`` (default deny). Identity and resource policies of one account are
  simply pooled: within an account an allow in either suffices.
- A statement matches when Action (or NotAction), Resource (or NotResource), Principal
  (resource policies; ``"*"`` and ``{"AWS": "*"}`` match every caller, anonymous too)
  and every condition match.
- Actions match case-insensitively with ``*``/``?`` wildcards; resources and StringLike
  values case-sensitively; condition key names case-insensitively.
- Conditions: operators AND, keys AND, values of one key OR. A key absent from the
  request makes a positive operator false and a negated one (``...Not...``) true, except
  for ``...IfExists`` (an absent key makes it true) and ``Null`` (tests presence).
  ``ForAllValues:`` is true when every request value matches some policy value (true for
  an absent or empty key); ``ForAnyValue:`` when some request value matches (false for
  an absent or empty key).
- Supported operators: StringEquals, StringNotEquals, StringEqualsIgnoreCase,
  StringNotEqualsIgnoreCase, StringLike, StringNotLike, ArnEquals, ArnLike,
  ArnNotEquals, ArnNotLike, Bool, Null, each with IfExists (not Null) and the two set
  qualifiers. Any other operator raises ValueError rather than guessing. Policy
  variables (``${aws:username}``) are not expanded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping

ALLOW, DENY, IMPLICIT_DENY = "Allow", "Deny", "ImplicitDeny"
ANONYMOUS = "anonymous"

_STRING_OPS = {"StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase",
               "StringLike", "StringNotLike"}
_ARN_OPS = {"ArnEquals", "ArnLike", "ArnNotEquals", "ArnNotLike"}
_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike"}


@dataclass(frozen=True)
class Request:
    """One authorization: a principal calling ``action`` on ``resource`` with a request context.

    Context values are strings or lists of strings (multivalued keys such as aws:TagKeys).
    """

    action: str
    resource: str
    context: Mapping[str, str | list[str]] = field(default_factory=dict)
    principal: str = ANONYMOUS


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@lru_cache(maxsize=None)
def _glob(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.S | (re.I if ignore_case else 0))


def glob_match(pattern: str, value: str, ignore_case: bool = False) -> bool:
    """IAM wildcard match: ``*`` any run of characters, ``?`` one character."""
    return _glob(pattern, ignore_case).fullmatch(value) is not None


def arn_match(pattern: str, value: str) -> bool:
    """ArnLike: each of the six colon-separated parts matched on its own (the last keeps its colons)."""
    p_parts, v_parts = pattern.split(":", 5), value.split(":", 5)
    if len(p_parts) != 6 or len(v_parts) != 6:
        return False
    return all(glob_match(p, v) for p, v in zip(p_parts, v_parts))


def _split_operator(operator: str) -> tuple[str | None, str, bool]:
    qualifier = None
    if ":" in operator:
        qualifier, operator = operator.split(":", 1)
        if qualifier not in ("ForAllValues", "ForAnyValue"):
            raise ValueError(f"unknown set qualifier {qualifier!r}")
    if_exists = operator.endswith("IfExists")
    base = operator[: -len("IfExists")] if if_exists else operator
    if base not in _STRING_OPS | _ARN_OPS | {"Bool", "Null"}:
        raise ValueError(f"condition operator {operator!r} is not supported by this evaluator")
    if base == "Null" and (if_exists or qualifier):
        raise ValueError("Null takes neither IfExists nor a set qualifier")
    return qualifier, base, if_exists


def _value_matches(base: str, policy_value: str, request_value: str) -> bool:
    """The positive form of ``base`` for one pair of values."""
    positive = base.replace("Not", "", 1) if base in _NEGATED else base
    if positive == "StringEquals":
        return policy_value == request_value
    if positive == "StringEqualsIgnoreCase":
        return policy_value.lower() == request_value.lower()
    if positive == "StringLike":
        return glob_match(policy_value, request_value)
    if positive in ("ArnEquals", "ArnLike"):
        return arn_match(policy_value, request_value)
    if positive == "Bool":
        return policy_value.lower() == request_value.lower()
    raise AssertionError(base)


def condition_holds(operator: str, key: str, policy_values: Any, context: Mapping[str, Any]) -> bool:
    """One (operator, key) entry of a Condition block against the request context."""
    qualifier, base, if_exists = _split_operator(operator)
    values = [str(v).lower() if isinstance(v, bool) else str(v) for v in _as_list(policy_values)]
    lowered = {k.lower(): v for k, v in context.items()}
    present = key.lower() in lowered
    if base == "Null":
        return any((v.lower() == "true") != present for v in values)
    if not present:
        if if_exists:
            return True
        if qualifier == "ForAllValues":
            return True
        if qualifier == "ForAnyValue":
            return False
        return base in _NEGATED
    request_values = [str(v) for v in _as_list(lowered[key.lower()])]
    negated = base in _NEGATED

    def one(rv: str) -> bool:
        hit = any(_value_matches(base, pv, rv) for pv in values)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(rv) for rv in request_values)
    if qualifier == "ForAnyValue":
        return any(one(rv) for rv in request_values)
    if len(request_values) != 1:
        raise ValueError(f"{key} has several values in the request: use ForAllValues/ForAnyValue")
    return one(request_values[0])


def conditions_hold(condition: Mapping[str, Mapping[str, Any]] | None, context: Mapping[str, Any]) -> bool:
    return all(condition_holds(op, key, vals, context)
               for op, entries in (condition or {}).items() for key, vals in entries.items())


def _principal_matches(principal: Any, caller: str) -> bool:
    if principal is None:  # identity-based policy: applies to the principal it is attached to
        return True
    if principal == "*":
        return True
    for kind, ids in principal.items():
        for ident in _as_list(ids):
            if ident == "*" and kind == "AWS":
                return True
            if ident == caller:
                return True
    return False


def statement_matches(statement: Mapping[str, Any], request: Request) -> bool:
    if "Action" in statement:
        if not any(glob_match(a, request.action, ignore_case=True) for a in _as_list(statement["Action"])):
            return False
    elif any(glob_match(a, request.action, ignore_case=True) for a in _as_list(statement["NotAction"])):
        return False
    if "Resource" in statement:
        if not any(glob_match(r, request.resource) for r in _as_list(statement["Resource"])):
            return False
    elif "NotResource" in statement:
        if any(glob_match(r, request.resource) for r in _as_list(statement["NotResource"])):
            return False
    if "NotPrincipal" in statement:
        raise ValueError("NotPrincipal is not supported by this evaluator")
    if not _principal_matches(statement.get("Principal"), request.principal):
        return False
    return conditions_hold(statement.get("Condition"), request.context)


def statements(policy: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return _as_list(policy["Statement"])


def evaluate(policies: Iterable[Mapping[str, Any]], request: Request) -> str:
    """ALLOW, DENY (an explicit deny matched) or IMPLICIT_DENY (nothing allowed it)."""
    allowed = False
    for policy in policies:
        for st in statements(policy):
            if st.get("Effect") not in (ALLOW, DENY):
                raise ValueError(f"statement {st.get('Sid')!r} has no valid Effect")
            if statement_matches(st, request):
                if st["Effect"] == DENY:
                    return DENY
                allowed = True
    return ALLOW if allowed else IMPLICIT_DENY
