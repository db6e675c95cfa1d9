"""Cluster capacity and cost: GPU nodes by pool and capacity type, GPU-hours vs budget, EFS."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.panels import Query, Row, dashboard, query_variable, stat, table, timeseries

UID = "ragpool-capacity-cost"
_POOL = 'pool=~"$pool"'


def build() -> Dashboard:
    overview = Row("Overview", [
        stat("GPU nodes", Query(f"sum(pool_capacity_type:kube_nodes:count{{{_POOL}}})"), unit="short",
             description="Nodes in the selected GPU pools."),
        stat("GPUs provisioned", Query(f"sum(pool_capacity_type:kube_node_gpus:sum{{{_POOL}}})"), unit="short",
             description="GPU capacity of those nodes."),
        stat("GPU-hours, last 30 days", Query("ragpool:gpu_hours:30d"), unit="short",
             description="All ragpool pools, from the per-minute GPU count (recording rule)."),
        stat("Budget used, 30 days", Query("ragpool:gpu_hours:30d / ragpool:gpu_hours_budget:30d"),
             unit="percentunit", description="GPU-hours over the configured 30-day budget.",
             thresholds=((None, "green"), (0.8, "orange"), (1, "red"))),
    ])
    nodes = Row("Nodes and GPUs", [
        timeseries("GPU nodes by pool and capacity type", [
            Query(f"pool_capacity_type:kube_nodes:count{{{_POOL}}}", "{{pool}} {{capacity_type}}"),
        ], unit="short", min_value=0, stacked=True,
            description="Nodes per pool, split by Karpenter capacity type (spot / on-demand)."),
        timeseries("GPUs by pool and capacity type", [
            Query(f"pool_capacity_type:kube_node_gpus:sum{{{_POOL}}}", "{{pool}} {{capacity_type}}"),
        ], unit="short", min_value=0, stacked=True, description="GPU capacity per pool and capacity type."),
        timeseries("GPUs requested vs provisioned", [
            Query(f"pool:kube_pod_gpu_requests:sum{{{_POOL}}}", "{{pool}} requested"),
            Query(f"sum by (pool) (pool_capacity_type:kube_node_gpus:sum{{{_POOL}}})", "{{pool}} provisioned"),
        ], unit="short", min_value=0, description="The gap is paid, unused GPU capacity."),
        timeseries("GPU utilisation by pool", [Query(f"pool:dcgm_gpu_utilization:avg{{{_POOL}}}", "{{pool}}")],
                   unit="percent", min_value=0, max_value=100,
                   description="How busy the provisioned GPUs are (DCGM, recording rule)."),
        table("GPU nodes of the selected pools", [
            Query(f"ragpool:node_pool:info{{{_POOL}}}", instant=True),
            Query(f'max by (node) (kube_node_status_allocatable{{resource="nvidia_com_gpu"}}) '
                  f'* on (node) group_left (pool) ragpool:node_pool:info{{{_POOL}}}', instant=True),
        ], unit="short", width=24,
            description="Every node of the selected pools with its capacity type and instance type, "
                        "and the GPUs the device plugin offers on it (B)."),
    ])
    cost = Row("GPU-hours", [
        timeseries("GPU-hours per day by pool and capacity type", [
            Query(f"sum_over_time(pool_capacity_type:kube_node_gpus:sum{{{_POOL}}}[1d]) / 60",
                  "{{pool}} {{capacity_type}}"),
        ], unit="short", min_value=0, stacked=True,
            description="GPU-hours over the trailing day (recording rule sampled every minute)."),
        timeseries("GPU-hours, rolling 30 days, vs budget", [
            Query("ragpool:gpu_hours:30d", "used"),
            Query("ragpool:gpu_hours_budget:30d", "budget"),
        ], unit="short", min_value=0, description="RagpoolGpuHoursNearBudget at 80%, OverBudget at 100%."),
    ])
    storage = Row("Shared storage (EFS)", [
        timeseries("EFS burst credits", [
            Query("min by (dimension_FileSystemId) (aws_efs_burst_credit_balance_minimum)", "{{dimension_FileSystemId}}"),
        ], unit="bytes", min_value=0, description="Burst credit balance (bursting throughput mode)."),
        timeseries("EFS throughput vs permitted", [
            Query("max by (dimension_FileSystemId) (aws_efs_metered_iobytes_sum) / 60", "{{dimension_FileSystemId}} metered"),
            Query("max by (dimension_FileSystemId) (aws_efs_permitted_throughput_average)",
                  "{{dimension_FileSystemId}} permitted"),
        ], unit="Bps", min_value=0, description="Metered I/O per second against the permitted throughput."),
    ])
    return dashboard(
        UID,
        "ragpool / Capacity and cost",
        description="GPU nodes by pool and capacity type, GPU-hours against the budget, shared storage.",
        tags=("capacity", "cost"),
        variables=[query_variable("pool", "Pool", "label_values(ragpool:node_pool:info, pool)")],
        rows=[overview, nodes, cost, storage],
    )
