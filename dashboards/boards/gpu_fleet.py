"""GPU fleet: utilisation, memory, temperature, power and errors per node and pool (DCGM)."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.panels import PanelBuilder, Query, Row, dashboard, query_variable, stat, table, timeseries

UID = "ragpool-gpu-fleet"
# DCGM series of the selected pools and nodes, with their pool as a label.
_SEL = 'node=~"$node"'
_POOL_JOIN = 'on (node) group_left (pool) ragpool:node_pool:info{pool=~"$pool"}'
_MIB = " * 1024 * 1024"  # DCGM reports framebuffer sizes in MiB
# Axes of the utilisation panels: DCGM's percentages (0-100) and its DCP activity ratios (0-1).
_PERCENT = dict(unit="percent", min_value=0, max_value=100)
_RATIO = dict(unit="percentunit", min_value=0, max_value=1)


def _per_gpu(metric: str, scale: str = "") -> str:
    """``metric`` of the selected GPUs (times ``scale``), with the GPU's pool as a label."""
    return f"{metric}{{{_SEL}}}{scale} * {_POOL_JOIN}"


def _rate_per_gpu(metric: str, scale: str = "") -> str:
    """Per-second rate of the counter ``metric`` per selected GPU (times ``scale``), with pool."""
    return f"rate({metric}{{{_SEL}}}[$__rate_interval]){scale} * {_POOL_JOIN}"


def _gpu_series(metric: str, scale: str = "") -> Query:
    """One series per selected GPU of the gauge ``metric`` (times ``scale``), named ``<node> gpu<N>``."""
    return Query(_per_gpu(metric, scale), "{{node}} gpu{{gpu}}")


def _pool_series(aggregation: str, metric: str, name: str, scale: str = "") -> Query:
    """``aggregation`` (avg, sum, min) of ``metric`` over each pool's selected GPUs, named ``<pool> name``."""
    return Query(f"{aggregation} by (pool) ({_per_gpu(metric, scale)})", f"{{{{pool}}}} {name}")


def _pool_rule(rule: str) -> Query:
    """A per-pool recording rule (dashboards/rules) for the selected pools, one series per pool."""
    return Query(f'{rule}{{pool=~"$pool"}}', "{{pool}}")


def _node_rate(metric: str, name: str) -> Query:
    """Per-second rate of the counter ``metric`` summed per selected node, named ``<node> name``."""
    return Query(f"sum by (node) (rate({metric}{{{_SEL}}}[$__rate_interval]))", f"{{{{node}}}} {name}")


def _latest_per_gpu(expr: str) -> Query:
    """The current value of ``expr`` (DCGM fields of the selected GPUs) per GPU, for a table."""
    return Query(f"max by (node, gpu, UUID) ({expr})", instant=True)


def _on_gpus(metric: str) -> str:
    """``metric`` of the selected GPUs, without the pool join (tables and counters)."""
    return f"{metric}{{{_SEL}}}"


# --------------------------------------------------------------------------- overview


def _gpus_reporting() -> PanelBuilder:
    return stat(
        "GPUs reporting",
        Query(f"count({_per_gpu('DCGM_FI_DEV_GPU_TEMP')})"),
        unit="short",
        description="GPUs of the selected pools and nodes that dcgm-exporter reports.",
    )


def _average_gpu_utilisation() -> PanelBuilder:
    return stat(
        "Average GPU utilisation",
        Query(f"avg({_per_gpu('DCGM_FI_DEV_GPU_UTIL')})"),
        unit="percent",
        description="Mean DCGM_FI_DEV_GPU_UTIL over the selected GPUs.",
        thresholds=((None, "red"), (30, "orange"), (70, "green")),
    )


def _power_draw() -> PanelBuilder:
    return stat(
        "Power draw",
        Query(f"sum({_per_gpu('DCGM_FI_DEV_POWER_USAGE')})"),
        unit="watt",
        description="Total power drawn by the selected GPUs.",
    )


def _gpus_with_xid_errors() -> PanelBuilder:
    return stat(
        "GPUs with XID errors (1h)",
        Query(
            f'count(max by (node, gpu) (max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{xid!="", {_SEL}}}[1h])) > 0) or vector(0)'
        ),
        unit="short",
        description="GPUs that reported any XID in the last hour.",
        thresholds=((None, "green"), (1, "red")),
    )


def _failed_health_checks() -> PanelBuilder:
    return stat(
        "Nodes failing pre-flight checks (1h)",
        Query('count(max by (node) (max_over_time(ragpool_worker_health_check_failed{node=~"$node"}[1h])) > 0) or vector(0)'),
        unit="short",
        description="Nodes where a worker's pre-flight GPU health check failed in the last hour "
                    "(training/components/health.py; alert RagpoolWorkerHealthCheckFailed).",
        thresholds=((None, "green"), (1, "red")),
    )


# --------------------------------------------------------------------------- utilisation


def _gpu_utilisation_by_pool() -> PanelBuilder:
    return timeseries(
        "GPU utilisation by pool",
        [_pool_rule("pool:dcgm_gpu_utilization:avg")],
        **_PERCENT,
        description="Average DCGM_FI_DEV_GPU_UTIL per pool (recording rule).",
    )


def _gpu_utilisation_per_gpu() -> PanelBuilder:
    return timeseries(
        "GPU utilisation per GPU",
        [_gpu_series("DCGM_FI_DEV_GPU_UTIL")],
        **_PERCENT,
        description="Per-GPU utilisation: the share of time a kernel was running.",
    )


def _tensor_core_activity() -> PanelBuilder:
    return timeseries(
        "Tensor core activity",
        [_gpu_series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")],
        **_RATIO,
        description="Ratio of cycles the tensor pipes are active (DCP): real math throughput.",
    )


def _graphics_engine_and_memory_interface_activity() -> PanelBuilder:
    return timeseries(
        "Graphics engine and memory interface activity",
        [_pool_series("avg", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "engine"),
         _pool_series("avg", "DCGM_FI_PROF_DRAM_ACTIVE", "dram")],
        **_RATIO,
        description="Average engine-active and DRAM-active ratios per pool (DCP).",
    )


# --------------------------------------------------------------------------- memory


def _framebuffer_used_by_pool() -> PanelBuilder:
    return timeseries(
        "Framebuffer used by pool",
        [_pool_rule("pool:dcgm_fb_used_ratio:avg")],
        **_RATIO,
        description="Average share of GPU memory in use per pool (recording rule).",
    )


def _framebuffer_used_per_gpu() -> PanelBuilder:
    return timeseries(
        "Framebuffer used per GPU",
        [_gpu_series("DCGM_FI_DEV_FB_USED", _MIB)],
        unit="bytes",
        min_value=0,
        description="GPU memory in use (DCGM reports MiB).",
    )


def _memory_copy_utilisation() -> PanelBuilder:
    return timeseries(
        "Memory copy utilisation",
        [_gpu_series("DCGM_FI_DEV_MEM_COPY_UTIL")],
        **_PERCENT,
        description="Share of time the memory controller was busy.",
    )


def _framebuffer_free_and_reserved() -> PanelBuilder:
    return timeseries(
        "Framebuffer free and reserved",
        [_pool_series("sum", "DCGM_FI_DEV_FB_FREE", "free", _MIB),
         _pool_series("sum", "DCGM_FI_DEV_FB_RESERVED", "reserved", _MIB)],
        unit="bytes",
        min_value=0,
        description="Free and driver-reserved GPU memory per pool.",
    )


# --------------------------------------------------------------------------- thermals


def _gpu_temperature() -> PanelBuilder:
    return timeseries(
        "GPU temperature",
        [_gpu_series("DCGM_FI_DEV_GPU_TEMP")],
        unit="celsius",
        description="GPU die temperature.",
    )


def _memory_temperature() -> PanelBuilder:
    return timeseries(
        "Memory temperature",
        [_gpu_series("DCGM_FI_DEV_MEMORY_TEMP")],
        unit="celsius",
        description="HBM temperature (GPUs that report it).",
    )


def _power_draw_per_gpu() -> PanelBuilder:
    return timeseries(
        "Power draw per GPU",
        [_gpu_series("DCGM_FI_DEV_POWER_USAGE")],
        unit="watt",
        min_value=0,
        description="Board power draw.",
    )


def _power_draw_by_pool() -> PanelBuilder:
    return timeseries(
        "Power draw by pool",
        [_pool_rule("pool:dcgm_power_usage_watts:sum")],
        unit="watt",
        min_value=0,
        stacked=True,
        description="Total GPU power per pool (recording rule).",
    )


def _time_throttled() -> PanelBuilder:
    return timeseries(
        "Time throttled",
        [
            Query(_rate_per_gpu("DCGM_FI_DEV_THERMAL_VIOLATION", " / 1e9"), "{{node}} gpu{{gpu}} thermal"),
            Query(_rate_per_gpu("DCGM_FI_DEV_POWER_VIOLATION", " / 1e9"), "{{node}} gpu{{gpu}} power"),
        ],
        unit="percentunit",
        min_value=0,
        description="Share of time throttled by thermal and power limits (violation ns per second / 1e9).",
    )


def _energy_used_by_pool() -> PanelBuilder:
    return timeseries(
        "Energy used by pool",
        [
            Query(
                f"sum by (pool) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{_SEL}}}[$__rate_interval]) * {_POOL_JOIN}) / 3.6e9",
                "{{pool}}",
            )
        ],
        unit="kwatth",
        min_value=0,
        description="Energy per interval (DCGM counts mJ; / 3.6e9 = kWh).",
    )


def _sm_and_memory_clocks() -> PanelBuilder:
    return timeseries(
        "SM and memory clocks",
        [_pool_series("avg", "DCGM_FI_DEV_SM_CLOCK", "SM"), _pool_series("avg", "DCGM_FI_DEV_MEM_CLOCK", "memory")],
        unit="rotmhz",
        min_value=0,
        description="Average clocks per pool; drops line up with throttling.",
    )


def _pcie_traffic() -> PanelBuilder:
    return timeseries(
        "PCIe traffic",
        [
            Query(f"sum by (node) ({_per_gpu('DCGM_FI_PROF_PCIE_TX_BYTES')})", "{{node}} tx"),
            Query(f"sum by (node) ({_per_gpu('DCGM_FI_PROF_PCIE_RX_BYTES')})", "{{node}} rx"),
        ],
        unit="Bps",
        min_value=0,
        description="Bytes per second over PCIe per node (DCP gauges).",
    )


def _nvlink_bandwidth_counter() -> PanelBuilder:
    return timeseries(
        "NVLink bandwidth counter",
        [
            Query(f"sum by (node) ({_rate_per_gpu('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL')})", "{{node}}"),
        ],
        unit="short",
        min_value=0,
        description="Per-second rate of DCGM's all-lane NVLink bandwidth counter per node, in DCGM's "
        "counter units; compare nodes and runs, not absolute link speeds.",
    )


# --------------------------------------------------------------------------- errors


def _xid_errors_by_code_current_window() -> PanelBuilder:
    return table(
        "XID errors by code (current window)",
        [
            Query(
                f'max by (node, gpu, UUID, xid, exported_pod) (DCGM_EXP_XID_ERRORS_COUNT{{xid!="", {_SEL}}}) > 0',
                instant=True,
            ),
            Query(f"max by (node, gpu, UUID) ({_on_gpus('DCGM_FI_DEV_XID_ERRORS')}) > 0", instant=True),
        ],
        unit="short",
        description="A: XID count per code within the exporter's window (5 min); B: the last XID code a "
        "GPU reported since the driver loaded. See the runbook for each code.",
    )


def _ecc_errors() -> PanelBuilder:
    return timeseries(
        "ECC errors",
        [
            Query(
                f"sum by (node, gpu) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{_SEL}}}[$__rate_interval]))",
                "{{node}} gpu{{gpu}} double-bit",
            ),
            Query(
                f"sum by (node, gpu) (increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{_SEL}}}[$__rate_interval]))",
                "{{node}} gpu{{gpu}} single-bit",
            ),
        ],
        unit="short",
        min_value=0,
        description="New volatile ECC errors per interval.",
    )


def _lifetime_ecc_retired_pages_and_remapped_rows() -> PanelBuilder:
    return table(
        "Lifetime ECC, retired pages and remapped rows",
        [
            _latest_per_gpu(_on_gpus("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")),
            _latest_per_gpu(_on_gpus("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")),
            _latest_per_gpu(f"{_on_gpus('DCGM_FI_DEV_RETIRED_DBE')} + {_on_gpus('DCGM_FI_DEV_RETIRED_SBE')}"),
            *(_latest_per_gpu(_on_gpus(metric)) for metric in (
                "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE")),
        ],
        unit="short",
        width=24,
        description="Persistent ECC counts (A: double-bit, B: single-bit), retired pages (C, D pending) "
        "and remapped rows (E uncorrectable, F correctable, G remap failure) per GPU.",
    )


def _nvlink_and_pcie_errors() -> PanelBuilder:
    return timeseries(
        "NVLink and PCIe errors",
        [_node_rate(metric, name) for metric, name in (
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLink CRC flit"),
            ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVLink CRC data"),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink replay"),
            ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recovery"),
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replay"),
        )],
        unit="short",
        min_value=0,
        description="Link error rates per node (per second).",
    )


def _gpus_visible_vs_node_capacity() -> PanelBuilder:
    return table(
        "GPUs visible vs node capacity",
        [
            Query('max by (node) (kube_node_status_capacity{resource="nvidia_com_gpu", node=~"$node"})', instant=True),
            Query('count by (node) (DCGM_FI_DEV_GPU_TEMP{node=~"$node"})', instant=True),
            Query(
                'max by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu", node=~"$node"})', instant=True
            ),
        ],
        unit="short",
        description="A: GPU capacity, B: GPUs DCGM sees, C: GPUs the device plugin offers. "
        "B < A: a GPU fell off the bus; C < A: the plugin marked one unhealthy.",
    )


def _encoder_decoder_and_vgpu_license() -> PanelBuilder:
    return timeseries(
        "Encoder, decoder and vGPU license",
        [
            _pool_series("avg", "DCGM_FI_DEV_ENC_UTIL", "encoder"),
            _pool_series("avg", "DCGM_FI_DEV_DEC_UTIL", "decoder"),
            _pool_series("min", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU license"),
        ],
        unit="short",
        min_value=0,
        description="Video engines (unused by training; non-zero means a foreign workload) and vGPU licence status.",
    )


def build() -> Dashboard:
    """The dashboard: one row per concern, each panel built by its own function above."""
    rows = [
        Row("Overview", [_gpus_reporting(), _average_gpu_utilisation(), _power_draw(), _gpus_with_xid_errors(), _failed_health_checks()]),
        Row(
            "Utilisation",
            [
                _gpu_utilisation_by_pool(),
                _gpu_utilisation_per_gpu(),
                _tensor_core_activity(),
                _graphics_engine_and_memory_interface_activity(),
            ],
        ),
        Row(
            "Memory",
            [
                _framebuffer_used_by_pool(),
                _framebuffer_used_per_gpu(),
                _memory_copy_utilisation(),
                _framebuffer_free_and_reserved(),
            ],
        ),
        Row(
            "Temperature, power and clocks",
            [
                _gpu_temperature(),
                _memory_temperature(),
                _power_draw_per_gpu(),
                _power_draw_by_pool(),
                _time_throttled(),
                _energy_used_by_pool(),
                _sm_and_memory_clocks(),
                _pcie_traffic(),
                _nvlink_bandwidth_counter(),
            ],
        ),
        Row(
            "Errors",
            [
                _xid_errors_by_code_current_window(),
                _ecc_errors(),
                _lifetime_ecc_retired_pages_and_remapped_rows(),
                _nvlink_and_pcie_errors(),
                _gpus_visible_vs_node_capacity(),
                _encoder_decoder_and_vgpu_license(),
            ],
        ),
    ]
    return dashboard(
        UID,
        "ragpool / GPU fleet",
        description="Health and use of every GPU in the ragpool GPU pools, from dcgm-exporter.",
        tags=("gpu",),
        variables=[
            query_variable("pool", "Pool", "label_values(ragpool:node_pool:info, pool)"),
            query_variable("node", "Node", 'label_values(ragpool:node_pool:info{pool=~"$pool"}, node)'),
        ],
        rows=rows,
    )
