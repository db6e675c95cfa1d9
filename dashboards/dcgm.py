"""DCGM exporter counters: our collectors CSV and the upstream default it replaces.

``dashboards/dcgm-counters.csv`` is mounted into dcgm-exporter as its collectors file
(the chart's ``customMetrics``). The exporter reads exactly one file and the list is
not additive, so ours is the complete list: every row of the upstream default (so no
dashboard loses a metric) plus the health fields the default leaves commented out.

The pinned upstream default is ``vendor/upstream/dcgm/default-counters.csv`` (README there);
the tests check ours keeps every row of it.

CSV format (upstream): ``#`` starts a comment; a row is
``DCGM field, Prometheus type, help`` with spaces around fields; the Prometheus metric
name is the field name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
COUNTERS_CSV = PACKAGE_DIR / "dcgm-counters.csv"
_PROM_TYPES = ("gauge", "counter", "label")


@dataclass(frozen=True)
class DcgmCounter:
    """One enabled row of a collectors CSV."""

    field: str
    """DCGM field name, also the Prometheus metric name."""
    prom_type: str
    """gauge, counter or label (label rows become labels on the other metrics)."""
    help: str
    """Help text as written in the CSV."""


class CountersFileError(ValueError):
    """A collectors CSV row that dcgm-exporter would reject."""


def parse_counters(path: Path) -> dict[str, DcgmCounter]:
    """Enabled rows of a collectors CSV keyed by field name; bad rows raise with file:line."""
    rows: dict[str, DcgmCounter] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or not parts[0]:
            raise CountersFileError(f"{path}:{lineno}: expected 'FIELD, type, help', got {raw!r}")
        field, prom_type, help_text = parts
        if not (field.startswith("DCGM_FI_") or field.startswith("DCGM_EXP_")):
            raise CountersFileError(f"{path}:{lineno}: field {field!r} is not a DCGM_FI_*/DCGM_EXP_* name")
        if prom_type not in _PROM_TYPES:
            raise CountersFileError(f"{path}:{lineno}: type {prom_type!r} of {field} is not one of {_PROM_TYPES}")
        if field in rows:
            raise CountersFileError(f"{path}:{lineno}: {field} listed twice")
        rows[field] = DcgmCounter(field, prom_type, help_text)
    return rows


def emitted_metric_names() -> set[str]:
    """DCGM metric names our exporter config emits (label rows are labels, not series)."""
    return {c.field for c in parse_counters(COUNTERS_CSV).values() if c.prom_type != "label"}
