"""Training runs: loss, throughput, step time and checkpoint age per run and rank."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.panels import Query, Row, dashboard, query_variable, stat, table, timeseries

UID = "ragpool-training-runs"
_SEL = 'run_id=~"$run_id", stage=~"$stage"'
_RANK = "{{run_id}} {{stage}} rank {{rank}}"
_RUN = "{{run_id}} {{stage}}"


def build() -> Dashboard:
    overview = Row("Overview", [
        stat("Runs exporting", Query(f"count(count by (run_id, stage) (ragpool_train_step_total{{{_SEL}}}))"),
             unit="short", description="Run stages whose ranks are being scraped now."),
        stat("Tokens per second", Query(f"sum(run_stage:ragpool_train_tokens_per_second:sum{{{_SEL}}})"),
             unit="short", description="Throughput of the selected runs, all ranks."),
        stat("Longest time since a step",
             Query(f"max(time() - max by (run_id, stage) (ragpool_train_last_step_timestamp_seconds{{{_SEL}}} > 0))"),
             unit="s", description="Over 15 minutes for 5 minutes raises RagpoolTrainingStalled.",
             thresholds=((None, "green"), (300, "orange"), (900, "red"))),
        stat("Oldest checkpoint",
             Query(f"max(time() - max by (run_id, stage) (ragpool_checkpoint_last_success_timestamp_seconds{{{_SEL}}} > 0))"),
             unit="s", description="Age of the oldest last-successful checkpoint among the selected runs.",
             thresholds=((None, "green"), (3600, "orange"), (7200, "red"))),
    ])
    progress = Row("Progress", [
        timeseries("Loss", [Query(f"ragpool_train_loss{{{_SEL}}}", _RANK)], unit="none",
                   description="Last loss per rank. Gaps are NaN/Inf (RagpoolTrainingLossNotFinite)."),
        timeseries("Tokens per second by run", [Query(f"run_stage:ragpool_train_tokens_per_second:sum{{{_SEL}}}", _RUN)],
                   unit="short", min_value=0,
                   description="Sum over ranks (recording rule); RagpoolTrainingThroughputDropped compares it "
                               "with its own earlier hour."),
        timeseries("Tokens per second by rank", [Query(f"ragpool_train_tokens_per_second{{{_SEL}}}", _RANK)],
                   unit="short", min_value=0, description="One slow rank holds back the whole data-parallel run."),
        timeseries("Samples per second by rank", [Query(f"ragpool_train_samples_per_second{{{_SEL}}}", _RANK)],
                   unit="short", min_value=0, description="Samples per second each rank processes."),
        timeseries("World size", [Query(f"max by (run_id, stage) (ragpool_train_world_size{{{_SEL}}})", _RUN),
                                  Query(f"max by (run_id, stage) (ragpool_train_min_world_size{{{_SEL}}})",
                                        "{{run_id}} {{stage}} min")],
                   unit="short", min_value=0,
                   description="Ranks each run trains on; an elastic run (nodes: {min, max}) steps down when a node "
                               "is lost and back up when one joins, never below its min (the second series): "
                               "below it the run stops (RagpoolTrainingBelowMinNodes)."),
        timeseries("Optimizer steps per second", [Query(f"run_stage:ragpool_train_steps:rate5m{{{_SEL}}}", _RUN)],
                   unit="short", min_value=0, description="Step rate of each run (recording rule, 5-minute rate)."),
        timeseries("Time since last step", [
            Query(f"time() - max by (run_id, stage) (ragpool_train_last_step_timestamp_seconds{{{_SEL}}} > 0)", _RUN),
        ], unit="s", min_value=0, description="Seconds since the run's most recent optimizer step."),
    ])
    step_time = Row("Step time", [
        timeseries("Step time p50 / p95 by run", [
            Query(f"histogram_quantile(0.5, sum by (run_id, stage, le) "
                  f"(rate(ragpool_train_step_duration_seconds_bucket{{{_SEL}}}[$__rate_interval])))", f"{_RUN} p50"),
            Query(f"run_stage:ragpool_train_step_duration_seconds:p95_5m{{{_SEL}}}", f"{_RUN} p95"),
        ], unit="s", min_value=0, description="Wall time of one optimizer step."),
        timeseries("Mean step time by rank", [
            Query(f"rate(ragpool_train_step_duration_seconds_sum{{{_SEL}}}[$__rate_interval])"
                  f" / rate(ragpool_train_step_duration_seconds_count{{{_SEL}}}[$__rate_interval])", _RANK),
        ], unit="s", min_value=0, description="A rank slower than the others points at its GPU or node."),
        timeseries("GPU memory allocated by rank", [Query(f"ragpool_gpu_memory_allocated_bytes{{{_SEL}}}", _RANK)],
                   unit="bytes", min_value=0, description="CUDA memory allocated by each rank (CUDA only)."),
        timeseries("GPU utilisation of the run's pods", [
            Query('DCGM_FI_DEV_GPU_UTIL * on (exported_namespace, exported_pod) group_left (run_id) '
                  'ragpool:pod_run_id:info{run_id=~"$run_id"}', "{{run_id}} {{exported_pod}} gpu{{gpu}}"),
        ], unit="percent", min_value=0, max_value=100,
            description="DCGM utilisation of the GPUs held by the run's pods (needs the ragpool.io/run-id pod label)."),
    ])
    checkpoints = Row("Checkpoints", [
        table("Checkpoint age per run and rank", [
            Query(f"time() - (ragpool_checkpoint_last_success_timestamp_seconds{{{_SEL}}} > 0)", instant=True),
        ], unit="s", description="Seconds since each rank's last successful checkpoint (ranks that wrote one)."),
        timeseries("Checkpoint age", [
            Query(f"time() - max by (run_id, stage) (ragpool_checkpoint_last_success_timestamp_seconds{{{_SEL}}} > 0)",
                  _RUN),
        ], unit="s", min_value=0, description="Over 2 hours raises RagpoolCheckpointTooOld."),
        timeseries("Checkpoint duration p95", [
            Query(f"histogram_quantile(0.95, sum by (run_id, stage, le) "
                  f"(rate(ragpool_checkpoint_duration_seconds_bucket{{{_SEL}}}[$__rate_interval])))", _RUN),
        ], unit="s", min_value=0, description="Time to write a checkpoint; growth points at storage throughput."),
        timeseries("Checkpoints written", [
            Query(f"sum by (run_id, stage) (increase(ragpool_checkpoint_duration_seconds_count{{{_SEL}}}[$__rate_interval]))",
                  _RUN),
        ], unit="short", min_value=0, description="Checkpoints completed per interval (all ranks that write)."),
    ])
    return dashboard(
        UID,
        "ragpool / Training runs",
        description="Progress and health of training runs, per run, stage and rank.",
        tags=("training",),
        variables=[
            query_variable("run_id", "Run", "label_values(ragpool_train_step_total, run_id)"),
            query_variable("stage", "Stage", 'label_values(ragpool_train_step_total{run_id=~"$run_id"}, stage)'),
        ],
        rows=[overview, progress, step_time, checkpoints],
    )
