"""Observability as code for ragpool: Prometheus rules, runbook and Grafana dashboards.

Nothing here starts processes or touches the network at import time; ``dashboards.build``
renders the dashboards and ``dashboards/rules/*.yaml`` are the alert and recording rules
that both ``promtool`` and the ``PrometheusRule`` objects are made from.
"""
