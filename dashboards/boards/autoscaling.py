"""Workers from the queue: per KEDA ScaledJob (one per kind of worker, each claiming its lanes),
the runs KEDA reads, the Jobs it started, their pods Pending and Running; KEDA's own health.

A row per ScaledJob, repeated for every value of ``$scaledjob``. The lanes of a ScaledJob are
the worker kind's (training/scheduler/lanes.py ``worker_lanes``); runs per lane as the keeper
counts them are on the Queue dashboard's Lanes row.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.panels import PanelBuilder, Query, Row, dashboard, query_variable, stat, timeseries

UID = "ragpool-autoscaling"
_NS = 'namespace=~"$namespace"'
_SJ = f'{_NS}, scaledjob="$scaledjob"'


def _pods_by_phase() -> Query:
    """Pods of the ScaledJob's Jobs that are Pending (node coming, or unschedulable) or Running."""
    return Query(
        "sum by (namespace, phase) ("
        f'(kube_pod_status_phase{{{_NS}, phase=~"Pending|Running"}} == 1)'
        " * on (namespace, pod) group_left ()"
        ' (label_replace(kube_pod_owner{owner_kind="Job"}, "job_name", "$1", "owner_name", "(.+)")'
        ' * on (namespace, job_name) group_left ()'
        ' kube_job_owner{owner_kind="ScaledJob", owner_name="$scaledjob"}))',
        "{{namespace}} {{phase}}")


def queued_runs() -> PanelBuilder:
    return timeseries("Queued runs (KEDA's count)", [
        Query(f"namespace_scaledjob:keda_queued_runs:sum{{{_SJ}}}", "{{namespace}}"),
    ], unit="short", min_value=0, width=6, description="Runs waiting in the ready lists of the ScaledJob's lanes, "
               "every priority, as KEDA last read them: the runs that need a worker of this kind.")


def jobs() -> PanelBuilder:
    return timeseries("Jobs", [
        Query(f"namespace_scaledjob:kube_jobs_unfinished:count{{{_SJ}}}", "{{namespace}} unfinished"),
        Query(f"namespace_scaledjob:kube_jobs_pending:count{{{_SJ}}}", "{{namespace}} no worker Ready yet"),
    ], unit="short", min_value=0, width=6, description="Jobs KEDA started that have not finished, and those "
               "whose worker holds no claim yet (KEDA's pending Jobs: it starts queued minus these).")


def pods() -> PanelBuilder:
    return timeseries("Pods Pending and Running", [_pods_by_phase()], unit="short", min_value=0, width=6,
                      description="Worker pods of those Jobs: Pending while Karpenter brings their node (or "
                      "while they cannot be placed), Running once scheduled.")


def scaler_errors() -> PanelBuilder:
    return timeseries("Scaler errors", [
        Query(f'sum by (namespace) (increase(keda_scaled_job_errors_total{{{_NS}, scaledJob="$scaledjob"}}[$__rate_interval]))',
              "{{namespace}}"),
    ], unit="short", min_value=0, width=6, description="Failed reads of the ScaledJob's lists "
               "(RagpoolKedaScalerErrors).")


def errors_total() -> PanelBuilder:
    return stat("KEDA read errors (1h)", Query(f"sum(increase(keda_scaled_job_errors_total{{{_NS}}}[1h])) or vector(0)"),
                unit="short", description="Failed reads of the queue by KEDA, every ScaledJob.",
                thresholds=((None, "green"), (1, "red")))


def queued_total() -> PanelBuilder:
    return stat("Runs waiting for a worker", Query(f"sum(namespace_scaledjob:keda_queued_runs:sum{{{_NS}}}) or vector(0)"),
                unit="short", description="Queued runs of every ScaledJob, as KEDA reads them.")


def jobs_total() -> PanelBuilder:
    return stat("Worker Jobs", Query(f"sum(namespace_scaledjob:kube_jobs_unfinished:count{{{_NS}}}) or vector(0)"),
                unit="short", description="Unfinished worker Jobs KEDA started.")


def build() -> Dashboard:
    overview = Row("Overview", [queued_total(), jobs_total(), errors_total()])
    per_kind = Row("$scaledjob", [queued_runs(), jobs(), pods(), scaler_errors()], repeat="scaledjob")
    return dashboard(
        UID,
        "ragpool / Autoscaling",
        description="KEDA's ScaledJobs: queued runs, worker Jobs and their pods per kind of worker.",
        tags=("queue", "autoscaling"),
        variables=[
            query_variable("namespace", "Namespace", 'label_values(keda_scaler_metrics_value{type="scaledjob"}, namespace)'),
            query_variable("scaledjob", "ScaledJob",
                           'label_values(keda_scaler_metrics_value{type="scaledjob", namespace=~"$namespace"}, scaledObject)'),
        ],
        rows=[overview, per_kind],
    )
