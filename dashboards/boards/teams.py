"""Teams: what each team (a training namespace with its Kueue ClusterQueue) holds, uses, borrows, waits
for and costs. The same queries as ``ragpool usage`` (their one home: dashboards/teams.py)."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import teams
from dashboards.panels import PanelBuilder, Query, Row, dashboard, stat, table, timeseries

UID = "ragpool-teams"
_RANGE = "$__range"


def pending_stat() -> PanelBuilder:
    return stat("Workloads pending", Query(f"sum({teams.PENDING})"), unit="short",
                description="Workloads waiting in every team's ClusterQueue (Kueue; active and inadmissible).",
                thresholds=((None, "green"), (1, "orange")))


def borrowed_stat() -> PanelBuilder:
    return stat("GPUs borrowed", Query(f"sum({teams.BORROWED})"), unit="short",
                description="GPUs the teams hold above their nominal quota, lent by the cohort.")


def idle_stat() -> PanelBuilder:
    return stat("Cohort GPUs idle", Query(f"sum({teams.COHORT_IDLE_GPUS})"), unit="short",
                description="Nominal GPU quota no workload reserves. Idle while workloads are pending for 15 "
                            "minutes raises RagpoolTeamStarvedWhileCohortIdle.")


def cost_stat() -> PanelBuilder:
    return stat("GPU cost per hour", Query(f"sum({teams.COST_PER_HOUR})"), unit="currencyUSD",
                description="What the GPUs the teams' Running pods hold cost per hour (OpenCost node prices "
                            "shared over each node's GPUs).")


def allocated_panel() -> PanelBuilder:
    return timeseries("GPUs allocated by team and capacity type", [
        Query(teams.ALLOCATED, "{{namespace}} {{capacity_type}}"),
    ], unit="short", min_value=0, stacked=True,
        description="GPUs requested by each team's Running pods on ragpool GPU nodes, spot and on-demand apart.")


def used_panel() -> PanelBuilder:
    return timeseries("GPUs used by team (DCGM)", [Query(teams.USED, "{{namespace}}")], unit="short", min_value=0,
                      description="DCGM utilisation of the GPUs each team's pods hold, in GPUs (a GPU busy half "
                                  "the time counts half).")


def quota_panel() -> PanelBuilder:
    return timeseries("Reserved vs nominal GPUs by team", [
        Query(teams.RESERVED, "{{namespace}} reserved"),
        Query(teams.NOMINAL, "{{namespace}} nominal"),
    ], unit="short", min_value=0,
        description="Kueue's GPU reservation of each team's ClusterQueue against its nominal quota (all flavors).")


def borrowed_panel() -> PanelBuilder:
    return timeseries("GPUs borrowed by team", [Query(teams.BORROWED, "{{namespace}}")], unit="short",
                      min_value=0, stacked=True,
                      description="Reservation above nominal quota, per flavor, summed: what preemption "
                                  "(reclaimWithinCohort) takes back when the lender needs it.")


def pending_panel() -> PanelBuilder:
    return timeseries("Workloads pending by team", [Query(teams.PENDING, "{{namespace}}")], unit="short",
                      min_value=0, description="Workloads waiting for quota in each team's ClusterQueue.")


def cost_panel() -> PanelBuilder:
    return timeseries("GPU cost per hour by team", [Query(teams.COST_PER_HOUR, "{{namespace}}")],
                      unit="currencyUSD", min_value=0, stacked=True,
                      description="Dollars per hour of the GPUs each team's Running pods hold.")


def totals_table() -> PanelBuilder:
    return table("GPU-hours and dollars over the time range by team", [
        Query(teams.gpu_hours(teams.ALLOCATED, _RANGE), instant=True),
        Query(teams.gpu_hours(teams.USED, _RANGE), instant=True),
        Query(teams.gpu_hours(teams.BORROWED, _RANGE), instant=True),
        Query(teams.dollars(_RANGE), instant=True),
    ], unit="short", width=24,
        description="Over the dashboard's time range: GPU-hours allocated (A), used (B, DCGM), borrowed (C), and "
                    "dollars (D); `ragpool usage --since` prints the same per team.")


def build() -> Dashboard:
    overview = Row("Overview", [pending_stat(), borrowed_stat(), idle_stat(), cost_stat()])
    usage = Row("Allocated and used", [allocated_panel(), used_panel(), cost_panel(), totals_table()])
    quota = Row("Quota and borrowing (Kueue)", [quota_panel(), borrowed_panel(), pending_panel()])
    return dashboard(
        UID,
        "ragpool / Teams",
        description="Per team: GPUs allocated (spot / on-demand) and used, nominal quota, borrowing, waiting "
                    "workloads and dollars.",
        tags=("teams", "kueue", "cost"),
        variables=[],
        rows=[overview, usage, quota],
    )
