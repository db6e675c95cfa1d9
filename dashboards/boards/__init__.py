"""The ragpool Grafana dashboards, one module each; ``ALL`` maps file stem -> builder."""

from __future__ import annotations

from typing import Callable

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.boards import autoscaling, capacity_cost, gpu_fleet, queue, teams, training_runs

#: Output file stem -> function building the dashboard. Stems and UIDs never change:
#: Grafana links and provisioning refer to them.
ALL: dict[str, Callable[[], Dashboard]] = {
    "gpu-fleet": gpu_fleet.build,
    "training-runs": training_runs.build,
    "queue": queue.build,
    "capacity-cost": capacity_cost.build,
    "autoscaling": autoscaling.build,
    "teams": teams.build,
}
#: Stems whose builder takes the stack's lanes (a row per lane; called without them, a default set).
PER_LANE: frozenset[str] = frozenset({"autoscaling"})
