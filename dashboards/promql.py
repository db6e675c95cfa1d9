"""Metric names used by a PromQL expression, by a small tokenizer (no full parser).

``promtool`` proves an expression parses; this module only answers "which series names
does it read", so tests can check each name is emitted by something ragpool configures.
It skips string literals, label matchers (``{...}``), ranges and subqueries (``[...]``),
durations and numbers, function and aggregation names (an identifier followed by ``(``),
keywords and the label lists of ``by``/``without``/``on``/``ignoring``/``group_left``/
``group_right``. A ``{__name__="x"}`` matcher counts as the name ``x``.

Grafana macros (``$__rate_interval`` ...) are replaced before parsing by
:func:`expand_grafana_macros`; template variables may appear only inside strings.
"""

from __future__ import annotations

import re

# Aggregation operators: the only non-function identifiers that may be followed by
# ``by``/``without`` instead of ``(``.
AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
})
# Keywords that take a parenthesised label list.
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
OTHER_KEYWORDS = frozenset({"bool", "and", "or", "unless", "atan2", "offset"})
NUMBER_WORDS = frozenset({"inf", "nan"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<lbrace>\{)
  | (?P<lbracket>\[)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=,@])
  """,
    re.VERBOSE,
)
_NAME_MATCHER = re.compile(r"""__name__\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""")
_GRAFANA_MACROS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}


class PromQLTokenError(ValueError):
    """The expression has something the tokenizer cannot place (unbalanced brackets...)."""


def expand_grafana_macros(expr: str) -> str:
    """Replace Grafana's interval macros with fixed durations so promtool can parse."""
    for macro, value in sorted(_GRAFANA_MACROS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(macro, value).replace("${" + macro[1:] + "}", value)
    return expr


def _skip_balanced(expr: str, start: int, open_ch: str, close_ch: str) -> tuple[int, str]:
    """Index after the bracket closing the one at ``start``, and the text inside.

    String literals inside are skipped so a ``}`` in a regex does not end the block.
    """
    depth = 0
    i = start
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            m = _TOKEN.match(expr, i)
            if not m or m.lastgroup != "string":
                raise PromQLTokenError(f"unterminated string at {i} in {expr!r}")
            i = m.end()
            continue
        if ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1, expr[start + 1:i]
        i += 1
    raise PromQLTokenError(f"unbalanced {open_ch!r} at {start} in {expr!r}")


def _next_significant(expr: str, pos: int) -> str:
    """The next non-space, non-comment character at or after ``pos`` ('' at the end)."""
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m and m.lastgroup in ("space", "comment"):
            pos = m.end()
            continue
        return expr[pos]
    return ""


def metric_names(expr: str) -> set[str]:
    """Series names the PromQL ``expr`` selects."""
    expr = expand_grafana_macros(expr)
    names: set[str] = set()
    depth = 0
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise PromQLTokenError(f"unexpected {expr[pos]!r} at {pos} in {expr!r}")
        kind = m.lastgroup
        if kind == "lbrace":
            pos, inside = _skip_balanced(expr, pos, "{", "}")
            for name_match in _NAME_MATCHER.finditer(inside):
                names.add(name_match.group(1) or name_match.group(2))
            continue
        if kind == "lbracket":
            pos, _ = _skip_balanced(expr, pos, "[", "]")
            continue
        pos = m.end()
        if kind == "lparen":
            depth += 1
        elif kind == "rparen":
            depth -= 1
            if depth < 0:
                raise PromQLTokenError(f"unbalanced ')' at {pos - 1} in {expr!r}")
        if kind != "ident":
            continue
        word = m.group()
        lower = word.lower()
        if word in LABEL_LIST_KEYWORDS:
            if _next_significant(expr, pos) == "(":
                paren = expr.index("(", pos)
                pos, _ = _skip_balanced(expr, paren, "(", ")")
            continue
        if word in AGGREGATIONS or word in OTHER_KEYWORDS or lower in NUMBER_WORDS:
            continue
        if _next_significant(expr, pos) == "(":
            continue  # a function call
        names.add(word)
    if depth:
        raise PromQLTokenError(f"unbalanced '(' in {expr!r}")
    return names
