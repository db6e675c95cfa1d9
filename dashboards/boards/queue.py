"""Task queue: depth by priority, oldest age, throughput, retries, dead-letter, workers, Redis."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.panels import Query, Row, dashboard, query_variable, stat, table, timeseries

UID = "ragpool-queue"
_PRIO = 'priority=~"$priority"'


def build() -> Dashboard:
    overview = Row("Overview", [
        stat("Tasks waiting", Query(f"sum(priority:ragpool_queue_depth:max{{{_PRIO}}})"), unit="short",
             description="Queued tasks of the selected priorities."),
        stat("Tasks running", Query("max(ragpool_queue_running)"), unit="short",
             description="Tasks under a worker's lease."),
        stat("Dead-lettered", Query("max(ragpool_queue_dead_letter_size)"), unit="short",
             description="Tasks that exhausted their retries.", thresholds=((None, "green"), (1, "orange"))),
        stat("Workers alive", Query("count(time() - ragpool_worker_last_heartbeat_timestamp_seconds < 300) or vector(0)"),
             unit="short", description="Workers with a heartbeat in the last 5 minutes."),
    ])
    queue = Row("Queue", [
        timeseries("Depth by priority", [Query(f"priority:ragpool_queue_depth:max{{{_PRIO}}}", "{{priority}}")],
                   unit="short", min_value=0, stacked=True, description="Waiting tasks per priority."),
        timeseries("Oldest waiting task", [
            Query(f"priority:ragpool_queue_oldest_age_seconds:max{{{_PRIO}}}", "{{priority}}"),
        ], unit="s", min_value=0, description="Over an hour for 10 minutes raises RagpoolQueueBacklogTooOld."),
        timeseries("Completions by outcome", [
            Query("outcome:ragpool_queue_tasks_completed:rate5m", "{{outcome}}"),
        ], unit="ops", min_value=0, stacked=True, description="Finished tasks per second by outcome (5-minute rate)."),
        timeseries("Retries and dead letters", [
            Query("max(rate(ragpool_queue_retries_total[$__rate_interval]))", "retries/s"),
            Query("max(ragpool_queue_dead_letter_size)", "dead-letter size"),
        ], unit="short", min_value=0, description="Retry rate and the size of the dead-letter list."),
        timeseries("Task duration p50 / p95 by outcome", [
            Query("histogram_quantile(0.5, sum by (outcome, le) (rate(ragpool_task_duration_seconds_bucket[$__rate_interval])))",
                  "{{outcome}} p50"),
            Query("histogram_quantile(0.95, sum by (outcome, le) (rate(ragpool_task_duration_seconds_bucket[$__rate_interval])))",
                  "{{outcome}} p95"),
        ], unit="s", min_value=0, description="Wall time of finished tasks."),
        timeseries("Running tasks", [Query("max(ragpool_queue_running)", "running")], unit="short", min_value=0,
                   description="Tasks under a lease over time."),
    ])
    workers = Row("Workers and Redis", [
        table("Worker heartbeat age", [
            Query("time() - max by (worker) (ragpool_worker_last_heartbeat_timestamp_seconds)", instant=True),
        ], unit="s", description="Seconds since each worker's last heartbeat; over 5 minutes alerts."),
        table("Redis instances", [
            Query("max by (instance) (redis_up)", instant=True),
            Query("max by (instance, role) (redis_instance_info)", instant=True),
        ], unit="short", description="A: exporter reached Redis (1/0). B: role of each instance."),
        timeseries("Redis clients and memory", [
            Query("max by (instance) (redis_connected_clients)", "{{instance}} clients"),
        ], unit="short", min_value=0, description="Connected clients (workers, submitters) per instance."),
        timeseries("Redis memory used", [Query("max by (instance) (redis_memory_used_bytes)", "{{instance}}")],
                   unit="bytes", min_value=0, description="Memory used by each Redis instance."),
    ])
    # Per lane (contract/lanes.py), from the keeper; Jobs and pods per lane come from
    # kube-state-metrics where the KEDA ScaledJobs are deployed.
    lanes = Row("Lanes", [
        timeseries("Runs waiting per lane", [Query("max by (queue, lane) (ragpool_lane_queued)", "{{queue}} {{lane}}")],
                   unit="short", min_value=0, description="Runs that need a worker of the lane (what KEDA's "
                   "Redis triggers count)."),
        timeseries("Runs running per lane", [Query("max by (queue, lane) (ragpool_lane_running)", "{{queue}} {{lane}}")],
                   unit="short", min_value=0, description="Runs of the lane under a lease."),
        timeseries("Workers per lane", [
            Query("max by (queue, lane, state) (ragpool_lane_workers)", "{{queue}} {{lane}} {{state}}"),
        ], unit="short", min_value=0, description="Live workers registered for the lane: waiting (started, no run "
                   "yet), running, exiting."),
        timeseries("Gang timeouts", [
            Query("max by (queue, lane) (increase(ragpool_gang_timeouts_total[$__rate_interval]))", "{{queue}} {{lane}}"),
        ], unit="short", min_value=0, description="Multi-node runs handed back because not all pods joined in time."),
        stat("Keeper last tick", Query("time() - max(ragpool_keeper_last_tick_timestamp_seconds)"), unit="s",
             description="Seconds since the keeper last reaped lapsed leases and requeued due retries.",
             thresholds=((None, "green"), (60, "red"))),
    ])
    return dashboard(
        UID,
        "ragpool / Queue",
        description="The Redis task queue: backlog, throughput, retries, dead letters, workers.",
        tags=("queue",),
        variables=[query_variable("priority", "Priority", "label_values(ragpool_queue_depth, priority)")],
        rows=[overview, queue, lanes, workers],
    )
