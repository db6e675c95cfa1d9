"""Every metric name a rule or dashboard reads is emitted by something ragpool configures:
our recording rules, the DCGM collectors file, the ragpool metric contract or the
third-party allow-list; and those lists hold nothing unused."""

from __future__ import annotations

import re

import pytest

from dashboards import dcgm, external_metrics, inventory, ragpool_metrics, rulefiles
from dashboards.promql import metric_names
from scripts.vendor_schemas import VENDOR_DIR

# The exporter's pinned default collectors list (vendor/upstream/README.md, source DE).
DEFAULT_COUNTERS_CSV = VENDOR_DIR / "dcgm" / "default-counters.csv"


@pytest.fixture(scope="module")
def used() -> dict[str, list[str]]:
    return inventory.used_metric_names()


def test_every_metric_read_is_emitted_by_something_ragpool_configures(used):
    sources = inventory.metric_sources()
    unaccounted = {name: places[:3] for name, places in used.items() if name not in sources}
    assert not unaccounted, f"metrics with no configured source: {unaccounted}"
    # Sanity: the inventory sees all four kinds of source.
    assert {sources[name] for name in used} == {"recording", "dcgm", "ragpool", "external"}


def test_every_dcgm_and_ragpool_name_is_classified_by_prefix(used):
    sources = inventory.metric_sources()
    for name in used:
        if name.startswith("DCGM_"):
            assert sources[name] == "dcgm", name
        elif name.startswith("ragpool_"):
            assert sources[name] == "ragpool", name


def test_external_allow_list_has_nothing_unused(used):
    unused = sorted(set(external_metrics.external_by_name()) - set(used))
    assert not unused, f"external metrics listed but never read: {unused}"


def test_every_contract_metric_is_on_a_dashboard():
    # Directly or through a recording rule the dashboard reads.
    recorded = {r.name: metric_names(r.expr) for r in rulefiles.recording_rules()}
    dashboard_names = set(inventory.used_metric_names(inventory.dashboard_expressions()))
    frontier = set(dashboard_names)
    while frontier:
        frontier = set().union(*(recorded.get(n, set()) for n in frontier)) - dashboard_names
        dashboard_names |= frontier
    exposed = ragpool_metrics.exposed_series_names()
    shown = {exposed[name].name for name in dashboard_names if name in exposed}
    missing = sorted({m.name for m in ragpool_metrics.CONTRACT} - shown)
    assert not missing, f"contract metrics no dashboard shows: {missing}"


def test_every_recording_rule_is_read_by_a_rule_or_dashboard(used):
    unread = sorted(r.name for r in rulefiles.recording_rules() if r.name not in used)
    assert not unread, f"recording rules nobody reads: {unread}"


def test_counters_file_parses_and_enables_the_health_fields():
    counters = dcgm.parse_counters(dcgm.COUNTERS_CSV)
    for field in (
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    ):
        assert field in counters, field
    assert counters["DCGM_FI_DRIVER_VERSION"].prom_type == "label"


def _default_counters():
    return dcgm.parse_counters(DEFAULT_COUNTERS_CSV)


def test_counters_file_keeps_every_upstream_default_row():
    # Our file replaces the exporter's default list, so dropping a row would drop a metric.
    default = _default_counters()
    ours = dcgm.parse_counters(dcgm.COUNTERS_CSV)
    missing = sorted(set(default) - set(ours))
    assert not missing, f"dcgm-counters.csv drops upstream default rows: {missing}"
    for field, row in default.items():
        assert ours[field].prom_type == row.prom_type, field


def test_the_default_exporter_lacks_what_we_enable(used):
    # The reason our counters file exists: these are commented out upstream.
    default = _default_counters()
    needed = {name for name in used if name.startswith("DCGM_")} - set(default)
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_EXP_XID_ERRORS_COUNT"} <= needed
    assert needed <= dcgm.emitted_metric_names()


def test_violation_counters_are_nanoseconds_as_the_rules_assume():
    # GpuThermalThrottling / GpuPowerThrottling divide the per-second rate by 1e9.
    for field in ("DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION"):
        line = next(x for x in DEFAULT_COUNTERS_CSV.read_text().splitlines() if field in x)
        assert "(in ns)" in line, line
    gpu_rules = (rulefiles.RULES_DIR / "gpu.yaml").read_text()
    assert gpu_rules.count("/ 1e9") == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("DCGM_FI_DEV_GPU_UTIL, gauge\n", r"x\.csv:1: expected 'FIELD, type, help'"),
        ("DCGM_FI_DEV_GPU_UTIL, histogram, help\n", r"x\.csv:1: type 'histogram'"),
        ("# c\nGPU_UTIL, gauge, help\n", r"x\.csv:2: field 'GPU_UTIL'"),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, a\nDCGM_FI_DEV_GPU_UTIL, gauge, b\n", r"x\.csv:2: DCGM_FI_DEV_GPU_UTIL listed twice"),
    ],
)
def test_bad_counters_rows_are_reported_with_file_and_line(tmp_path, text, message):
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(dcgm.CountersFileError, match=message):
        dcgm.parse_counters(path)



def test_yace_names_follow_from_the_yace_job():
    job = external_metrics.YACE_EFS_JOB
    derived = {
        external_metrics.yace_metric_name(job["type"], m["name"], stat)
        for m in job["metrics"]
        for stat in m["statistics"]
    }
    listed = {m.name for m in external_metrics.EXTERNAL_METRICS if m.source == "yace"}
    assert derived == listed
    assert external_metrics.yace_metric_name("AWS/EFS", "PercentIOLimit", "Average") == "aws_efs_percent_iolimit_average"
    storage = (rulefiles.RULES_DIR / "storage.yaml").read_text()
    assert f"/ {external_metrics.YACE_EFS_PERIOD_SECONDS}" in storage


def test_ksm_label_names_follow_kube_state_metrics():
    # internal/store/utils.go at v2.20.0: "label_" + key, [^a-zA-Z0-9_] -> "_", camelCase -> snake_case.
    assert external_metrics.ksm_label("ragpool.io/run-id") == "label_ragpool_io_run_id"
    assert external_metrics.ksm_label("lane.ragpool.io/pool.gpu-spot.n2") == "label_lane_ragpool_io_pool_gpu_spot_n2"
    assert external_metrics.ksm_label("example.com/fooBar") == "label_example_com_foo_bar"


_LABELS_METRIC = {"kube_node_labels": "nodes", "kube_pod_labels": "pods", "kube_job_labels": "jobs"}


def _allowed_patterns() -> dict[str, list[re.Pattern[str]]]:
    """Resource -> the label names kube-state-metrics emits for its allow-list entry: one exact
    name per key, a prefix pattern per key ending in the partial wildcard ``*`` (KSM v2.20.0)."""
    patterns: dict[str, list[re.Pattern[str]]] = {}
    for entry in external_metrics.KSM_METRIC_LABELS_ALLOWLIST:
        match = re.fullmatch(r"(nodes|pods|jobs)=\[(.+)\]", entry)
        assert match, entry
        for key in match.group(2).split(","):
            assert key.count("*") <= 1 and (key.count("*") == 0 or key.endswith("*")), key
            if key.endswith("*"):
                pattern = re.compile(re.escape(external_metrics.ksm_label(key[:-1])) + r"[a-z0-9_]+")
            else:
                pattern = re.compile(re.escape(external_metrics.ksm_label(key)))
            patterns.setdefault(match.group(1), []).append(pattern)
    return patterns


def test_every_kube_label_read_is_in_the_ksm_allow_list():
    """A ``label_*`` an expression reads is allowed for a resource whose ``kube_<kind>_labels`` it
    reads; every allow-list entry is read."""
    patterns = _allowed_patterns()
    unlisted, matched = [], set()
    for expression in inventory.all_expressions():
        resources = [_LABELS_METRIC[n] for n in metric_names(expression.expr) if n in _LABELS_METRIC]
        if not resources:
            continue
        for name in set(re.findall(r"\blabel_[a-z0-9_]+\b(?!\s*\()", expression.expr)):
            hits = [p for r in resources for p in patterns.get(r, []) if p.fullmatch(name)]
            if not hits:
                unlisted.append((expression.where, name))
            matched |= {p.pattern for p in hits}
    assert matched, "no rule reads kube_*_labels label_* labels?"
    assert not unlisted, f"label_* read but not allow-listed for the resource read: {unlisted}"
    unread = sorted({p.pattern for ps in patterns.values() for p in ps} - matched)
    assert not unread, f"allow-listed but never read: {unread}"
