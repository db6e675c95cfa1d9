"""Workers from the queue: per lane, the runs waiting in it, the worker Jobs that claim it and their
pods Pending and Running; KEDA's own counts and health on the overview.

One row per lane of the stack (contract/lanes.py), rendered from the lanes the stack's
workers claim (infra/monitoring.py passes them; ``ragpool dashboards --lanes`` for a file). Not a
Grafana repeat: a lane's Jobs and pods are selected by a label *name* (``label_lane_ragpool_io_<lane>``,
kube-state-metrics' form of ``lane.ragpool.io/<lane>``), which a template variable cannot supply
inside PromQL. A Job of the default pool claims both its pinned lane and the unpinned one, so it
shows in both rows. Queued runs come from the queue keeper (``ragpool_lane_queued{queue, lane}``;
``queue`` is the queue namespace, a training namespace's Redis prefix), Jobs and pods from
kube-state-metrics (``namespace`` is the Kubernetes namespace).
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.external_metrics import lane_ksm_label
from dashboards.panels import PanelBuilder, Query, Row, dashboard, query_variable, stat, timeseries
from contract.lanes import Lane

UID = "ragpool-autoscaling"
_NS = 'namespace=~"$namespace"'
_QUEUE = 'queue=~"$queue"'
#: Lanes rendered when no stack names its own (``ragpool dashboards`` without ``--lanes``): those
#: that need no pool name, the unpinned single-pod torchrun lane and the ray lane.
DEFAULT_LANES: tuple[Lane, ...] = (Lane(), Lane("ray"))
_FINISHED = '(kube_job_complete{condition="true"} == 1 or kube_job_failed{condition="true"} == 1)'
_READY_JOBS = ('(label_replace(kube_pod_owner{owner_kind="Job"}, "job_name", "$1", "owner_name", "(.+)")'
               ' * on (namespace, pod) group_left () (kube_pod_status_ready{condition="true"} == 1))')


def _lane_jobs(lane: Lane) -> str:
    """Unfinished worker Jobs whose worker claims ``lane`` (KEDA's running Jobs, per lane)."""
    return (f'kube_job_labels{{{_NS}, {lane_ksm_label(lane)}="true"}}'
            f" unless on (namespace, job_name) {_FINISHED}")


def queued_runs(lane: Lane) -> PanelBuilder:
    return timeseries(f"{lane.name}: queued runs", [
        Query(f'max by (queue) (ragpool_lane_queued{{{_QUEUE}, lane="{lane.name}"}})', "{{queue}}"),
    ], unit="short", min_value=0, width=8, description=f"Runs waiting in the ready lists of lane {lane.name}, "
               "every priority, as the queue keeper counts them: the runs that need a worker of the lane "
               "(what KEDA's Redis triggers read).")


def jobs(lane: Lane) -> PanelBuilder:
    return timeseries(f"{lane.name}: Jobs", [
        Query(f"count by (namespace) ({_lane_jobs(lane)})", "{{namespace}} unfinished"),
        Query(f"count by (namespace) (({_lane_jobs(lane)}) unless on (namespace, job_name) {_READY_JOBS})",
              "{{namespace}} no worker Ready yet"),
    ], unit="short", min_value=0, width=8, description=f"Worker Jobs claiming lane {lane.name} (label "
               f"lane.ragpool.io/{lane.name}) that have not finished, and those whose worker holds no claim "
               "yet (Pending pod, or starting).")


def pods(lane: Lane) -> PanelBuilder:
    return timeseries(f"{lane.name}: pods Pending and Running", [
        Query("sum by (namespace, phase) ("
              f'(kube_pod_status_phase{{{_NS}, phase=~"Pending|Running"}} == 1)'
              f' * on (namespace, pod) group_left () kube_pod_labels{{{lane_ksm_label(lane)}="true"}})',
              "{{namespace}} {{phase}}"),
    ], unit="short", min_value=0, width=8, description=f"Worker pods claiming lane {lane.name}: Pending while "
               "Karpenter brings their node (or while they cannot be placed), Running once scheduled.")


def lane_row(lane: Lane) -> Row:
    """The row of one lane: its queued runs, its Jobs, their pods. A multi-node lane's row is collapsed
    (a pool has one per gang size it can hold: open them when needed, and they query only then)."""
    return Row(f"Lane {lane.name}", [queued_runs(lane), jobs(lane), pods(lane)], collapsed=lane.nodes > 1)


def scaler_errors() -> PanelBuilder:
    return timeseries("Scaler errors by ScaledJob", [
        Query(f"sum by (namespace, scaledJob) (increase(keda_scaled_job_errors_total{{{_NS}}}[$__rate_interval]))",
              "{{namespace}} {{scaledJob}}"),
    ], unit="short", min_value=0, width=24, description="Failed reads of each ScaledJob's lists "
               "(RagpoolKedaScalerErrors); a ScaledJob reads the lists of its worker's lanes.")


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


def pending_total() -> PanelBuilder:
    return stat("Jobs with no worker Ready", Query(f"sum(namespace_scaledjob:kube_jobs_pending:count{{{_NS}}}) or vector(0)"),
                unit="short", description="Worker Jobs KEDA started whose worker holds no claim yet: their pod "
                "is Pending (node coming) or starting.")


def build(lanes: Sequence[Lane] = DEFAULT_LANES) -> Dashboard:
    """The board with one row per lane of ``lanes`` (in that order, duplicates dropped). Raises
    ValueError when two lanes have the same kube-state-metrics label (their rows would mix)."""
    lanes = tuple(dict.fromkeys(lanes))
    if not lanes:
        raise ValueError("the Autoscaling dashboard needs at least one lane")
    seen: dict[str, Lane] = {}
    for lane in lanes:
        label = lane_ksm_label(lane)
        if label in seen:
            raise ValueError(f"lanes {seen[label].name!r} and {lane.name!r} are both {label!r} in "
                             "kube-state-metrics: rename a pool so that their lane labels differ")
        seen[label] = lane
    overview = Row("Overview", [queued_total(), jobs_total(), pending_total(), errors_total(), scaler_errors()])
    return dashboard(
        UID,
        "ragpool / Autoscaling",
        description="Workers from the queue, a row per lane: queued runs, worker Jobs and their pods.",
        tags=("queue", "autoscaling"),
        variables=[
            query_variable("namespace", "Namespace", 'label_values(keda_scaler_metrics_value{type="scaledjob"}, namespace)'),
            query_variable("queue", "Queue", "label_values(ragpool_lane_queued, queue)"),
        ],
        rows=[overview, *(lane_row(lane) for lane in lanes)],
    )
