"""The PromQL metric-name tokenizer used to check which series rules and panels read."""

from __future__ import annotations

import pytest

from dashboards.promql import PromQLTokenError, expand_grafana_macros, metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('rate(http_requests_total{job="a", code=~"5.."}[5m])', {"http_requests_total"}),
        # aggregation with by before and after the argument; label lists are not metrics
        ("sum by (pool, node) (foo)", {"foo"}),
        ("sum(foo) without (instance, job)", {"foo"}),
        # vector matching keywords and their label lists
        ("a * on (node) group_left (pool, capacity_type) b", {"a", "b"}),
        ("a / ignoring (le) group_right b", {"a", "b"}),
        ("a and on () b unless c or d", {"a", "b", "c", "d"}),
        ("a > bool 5", {"a"}),
        # strings may contain anything, including names, braces and template variables
        ('label_replace(a, "dst", "$1", "src_metric", "(.+)")', {"a"}),
        ('a{pool=~"$pool", x="}{not_a_metric"}', {"a"}),
        # durations, offsets, subqueries, numbers, Inf/NaN
        ("avg_over_time(x[1h] offset 30m) < 0.5 * y offset 1h30m", {"x", "y"}),
        ("max_over_time(rate(z[5m])[1h:1m])", {"z"}),
        ("abs(loss) == Inf or loss != loss or nan_metric > NaN", {"loss", "nan_metric"}),
        ("1e9 + 0x1F + 4.5 - .5", set()),
        # recording-rule names with colons, {__name__=...} selectors
        ("pool:dcgm_gpu_utilization:avg{pool=\"a\"}", {"pool:dcgm_gpu_utilization:avg"}),
        ('{__name__="via_matcher", job="x"}', {"via_matcher"}),
        # functions are not metrics even when they look like one
        ("histogram_quantile(0.95, sum by (le) (rate(d_bucket[5m])))", {"d_bucket"}),
        ("time() - max(ts_seconds > 0) > 900", {"ts_seconds"}),
        ("vector(5000)", set()),
        ("count(x) or vector(0)", {"x"}),
        # Grafana macros
        ("rate(c_total[$__rate_interval])", {"c_total"}),
        # a metric named like a keyword prefix stays a metric
        ("bytes_offset + group_size", {"bytes_offset", "group_size"}),
        # comments
        ("a # b is a comment\n + c", {"a", "c"}),
    ],
)
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_expand_grafana_macros():
    assert expand_grafana_macros("rate(x[$__rate_interval]) + y[${__interval}] + z[$__range]") == (
        "rate(x[5m]) + y[1m] + z[1h]"
    )


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", 'x{a="b"', 'x{a="unterminated}', "x $ y"])
def test_malformed_expressions_raise(expr):
    with pytest.raises(PromQLTokenError):
        metric_names(expr)


def test_unbalanced_closing_paren_raises():
    with pytest.raises(PromQLTokenError, match="unbalanced"):
        metric_names("sum(x))")
