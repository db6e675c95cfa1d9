"""``ragpool report RUN_ID``: one self-contained ``report.html`` per run, with PNG plots beside it.

Reads only what a run leaves in its directory: rank 0's per-step records in
``<stage>/log.jsonl`` (loss, learning rate, throughput; see :mod:`training.components.logs`),
an elastic run's resize marks ``<stage>/resizes.jsonl`` (:mod:`training.elastic.resizes`: a dashed line on the
loss and throughput plots at each, and a table), the stages' ``_COMPLETE`` markers and ``evaluate/report.json``. Writes
``<run>/report.html`` (plots embedded, no network needed to view it) and
``<run>/report/*.png``. Torch-free; matplotlib draws the plots.
"""

from __future__ import annotations

import base64
import html
import io
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.components.logs import STAGE_LOG as _STAGE_LOG
from training.components.logs import STEP_MESSAGE as _STEP
from training.components.stage import COMPLETE_MARKER as _COMPLETE
from training.elastic import resizes as _resizes
from training.config.sections import STAGES
from contract.paths import run_dir as run_dir_of

REPORT_HTML = "report.html"
PLOTS_DIR = "report"
TRAINING_STAGES = ("retriever", "generator")
"""Stages that train (and so have per-step records)."""


@dataclass
class StageSeries:
    """Per-step values of one training stage (the last record of each step wins: a resumed
    run redoes the steps after its checkpoint)."""

    steps: list[int] = field(default_factory=list)
    ts: list[float] = field(default_factory=list)
    fields: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass
class RunData:
    run_id: str
    run_dir: Path
    series: dict[str, StageSeries]
    markers: dict[str, dict[str, Any]]
    started: dict[str, float]
    evaluation: dict[str, Any] | None
    resizes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Each training stage's resize marks, in order (an elastic run's; none for a fixed-size one)."""


class ReportError(ValueError):
    """The run cannot be reported (unknown run id, nothing recorded)."""


def read_series(stage_log: Path) -> StageSeries:
    by_step: dict[int, tuple[float, dict[str, float]]] = {}
    with open(stage_log, encoding="utf-8", errors="replace") as fh:
        for text in fh:
            try:
                rec = json.loads(text)
            except ValueError:
                continue
            if not isinstance(rec, dict) or rec.get("message") != _STEP or not isinstance(rec.get("step"), int):
                continue
            by_step[rec["step"]] = (float(rec.get("ts") or 0.0), dict(rec.get("fields") or {}))
    series = StageSeries()
    names = sorted({k for _, f in by_step.values() for k in f})
    series.fields = {k: [] for k in names}
    for step in sorted(by_step):
        ts, values = by_step[step]
        series.steps.append(step)
        series.ts.append(ts)
        for k in names:
            series.fields[k].append(values.get(k))
    return series


def load_run(shared_root: str | Path, run_id: str) -> RunData:
    run_dir = run_dir_of(shared_root, run_id)
    if not run_dir.is_dir():
        raise ReportError(f"no run {run_id!r} under {Path(shared_root) / 'runs'}")
    series: dict[str, StageSeries] = {}
    started: dict[str, float] = {}
    markers: dict[str, dict[str, Any]] = {}
    resizes: dict[str, list[dict[str, Any]]] = {}
    for stage in STAGES:
        sdir = run_dir / stage
        if marks := _resizes.read(sdir):
            resizes[stage] = marks
        log = sdir / _STAGE_LOG
        if log.is_file():
            s = read_series(log)
            if s.steps:
                series[stage] = s
            first = _first_ts(log)
            if first is not None:
                started[stage] = first
        if (sdir / _COMPLETE).is_file():
            markers[stage] = json.loads((sdir / _COMPLETE).read_text())
    evaluation = None
    report_json = run_dir / "evaluate" / "report.json"
    if report_json.is_file():
        evaluation = json.loads(report_json.read_text())
    if not series and not markers:
        raise ReportError(f"run {run_id!r} has recorded nothing yet under {run_dir}")
    return RunData(run_id, run_dir, series, markers, started, evaluation, resizes)


def _first_ts(log: Path) -> float | None:
    with open(log, encoding="utf-8", errors="replace") as fh:
        for text in fh:
            try:
                ts = json.loads(text).get("ts")
            except (ValueError, AttributeError):
                continue
            if isinstance(ts, (int, float)):
                return float(ts)
    return None


# --------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display
    import matplotlib.pyplot as plt

    return plt


def resize_x(mark: dict[str, Any]) -> float:
    """Where a resize mark sits on a step axis: between the step resumed from and the first at the new size."""
    return mark["step"] + 0.5


def _mark_resizes(ax, marks: list[dict[str, Any]]) -> None:
    """A dashed vertical line per resize, labelled ``nodes A->B`` (after the plotted series: ``lines[0]`` stays
    the data)."""
    for m in marks:
        ax.axvline(resize_x(m), color="grey", linestyle="--", linewidth=1)
        ax.annotate(f" {m['from_nodes']}\u2192{m['to_nodes']} nodes", (resize_x(m), 0.98),
                    xycoords=("data", "axes fraction"), ha="left", va="top", fontsize=7, color="grey")


def loss_figure(stage: str, s: StageSeries, marks: list[dict[str, Any]] | None = None):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(s.steps, s.fields.get("loss", []), marker="." if len(s.steps) <= 50 else None, label="loss")
    _mark_resizes(ax, marks or [])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(f"{stage}: training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def lr_figure(series: dict[str, StageSeries]):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for stage, s in series.items():
        if "lr" in s.fields:
            ax.plot(s.steps, s.fields["lr"], label=stage)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title("Learning-rate schedule")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def throughput(s: StageSeries) -> tuple[list[int], list[float], str]:
    """Samples per second per step when recorded, else steps per second from the record times."""
    if "samples_per_s" in s.fields:
        pts = [(st, v) for st, v in zip(s.steps, s.fields["samples_per_s"]) if v is not None]
        return [p[0] for p in pts], [p[1] for p in pts], "samples/s"
    steps, rates = [], []
    for i in range(1, len(s.steps)):
        dt = s.ts[i] - s.ts[i - 1]
        if dt > 0 and s.steps[i] == s.steps[i - 1] + 1:
            steps.append(s.steps[i])
            rates.append(1.0 / dt)
    return steps, rates, "steps/s"


def throughput_figure(series: dict[str, StageSeries], resizes: dict[str, list[dict[str, Any]]] | None = None):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    unit = ""
    for stage, s in series.items():
        steps, rates, unit = throughput(s)
        ax.plot(steps, rates, label=stage)
    _mark_resizes(ax, [m for stage in series for m in (resizes or {}).get(stage, [])])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(unit)
    ax.set_title("Throughput per step")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def stage_timings(data: RunData) -> dict[str, float]:
    """Seconds from a stage's first record to its completion marker (stages that finished)."""
    out = {}
    for stage, marker in data.markers.items():
        start, end = data.started.get(stage), marker.get("completed_at")
        if isinstance(end, (int, float)) and start is not None and end >= start:
            out[stage] = float(end) - start
    return out


def timings_figure(timings: dict[str, float]):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.6))
    names = list(timings)
    ax.barh(names, [timings[n] for n in names])
    ax.set_xlabel("seconds")
    ax.set_title("Stage wall time")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def figures(data: RunData) -> dict[str, Any]:
    """Every plot of the report, by file stem (the tests read their data back)."""
    figs: dict[str, Any] = {}
    for stage, s in data.series.items():
        if "loss" in s.fields:
            figs[f"loss_{stage}"] = loss_figure(stage, s, data.resizes.get(stage))
    if any("lr" in s.fields for s in data.series.values()):
        figs["learning_rate"] = lr_figure(data.series)
    if data.series:
        figs["throughput"] = throughput_figure(data.series, data.resizes)
    timings = stage_timings(data)
    if timings:
        figs["stage_timings"] = timings_figure(timings)
    return figs


# --------------------------------------------------------------------------- HTML


def _evaluation_rows(ev: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, pretrained, fine-tuned) rows for the retrieval and generation scores."""
    tuned = ev.get("retrieval") or {}
    base = ev.get("retrieval_pretrained") or {}
    keys = [k for k in tuned if k.startswith("recall@") or k == "mrr"]
    rows = [(k, _fmt(base.get(k)), _fmt(tuned.get(k))) for k in keys]
    gen = ev.get("generation") or {}
    for k in ("exact_match", "f1"):
        if k in gen:
            rows.append((f"generator {k.replace('_', ' ')}", "-", _fmt(gen[k])))
    return rows


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def resize_rows(resizes: dict[str, list[dict[str, Any]]]) -> list[tuple[str, ...]]:
    """(stage, time UTC, resumed from step, nodes, ranks, cause) per resize mark."""
    return [(stage, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m["at"])), str(m["step"]),
             f"{m['from_nodes']} \u2192 {m['to_nodes']}", f"{m['from_world']} \u2192 {m['to_world']}",
             str(m.get("cause") or "not known"))
            for stage, marks in resizes.items() for m in marks]


def _gpu_hours(data: RunData, timings: dict[str, float]) -> str:
    ev = data.evaluation or {}
    run_yaml = data.run_dir / "run.yaml"
    device = None
    if run_yaml.is_file():
        import yaml

        device = (yaml.safe_load(run_yaml.read_text()) or {}).get("device")
    world = ev.get("world_size")
    if device != "cuda" or not isinstance(world, int):
        return "not known (a CPU run, or the run config does not say cuda)"
    return f"{sum(timings.values()) * world / 3600:.2f} (wall time x {world} GPUs)"


_PLOT_LOCK = threading.Lock()
"""pyplot's figure registry is process-global: the run API draws reports from several threads one at a time."""


def build(shared_root: str | Path, run_id: str) -> tuple[str, dict[str, bytes]]:
    """The report of ``run_id`` (the page, its plots embedded) and each plot's PNG by name; writes nothing (the
    run API builds it on a read-only shared root). :func:`render` writes them; both paths show this page."""
    data = load_run(shared_root, run_id)
    pngs: dict[str, bytes] = {}
    with _PLOT_LOCK:
        plt = _pyplot()
        for stem, fig in figures(data).items():
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=110)
            plt.close(fig)
            pngs[stem] = buf.getvalue()
    images = [(stem, base64.b64encode(png).decode()) for stem, png in pngs.items()]
    timings = stage_timings(data)
    parts = [f"<h1>ragpool run {html.escape(run_id)}</h1>",
             f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} from {html.escape(str(data.run_dir))}.</p>"]
    if data.evaluation:
        parts += ["<h2>Evaluation</h2>",
                  _table(("metric", "pretrained retriever", "fine-tuned"), _evaluation_rows(data.evaluation)),
                  f"<p>{data.evaluation.get('questions', '?')} evaluation questions.</p>"]
    parts += ["<h2>Stages</h2>",
              _table(("stage", "state", "steps", "wall time (s)"),
                     [(s, "complete" if s in data.markers else "not complete",
                       str(len(data.series[s].steps)) if s in data.series else "-",
                       f"{timings[s]:.1f}" if s in timings else "-")
                      for s in STAGES if s in data.markers or s in data.series]),
              f"<p>GPU-hours: {html.escape(_gpu_hours(data, timings))}</p>"]
    if data.resizes:
        parts += ["<h2>Resizes</h2>",
                  _table(("stage", "resumed at (UTC)", "from step", "nodes", "ranks", "cause"),
                         resize_rows(data.resizes)),
                  "<p>The world size changed: the ranks resumed from the step's checkpoint at the new size, the "
                  "global batch kept (dashed lines on the plots).</p>"]
    parts += ["<h2>Training</h2>"]
    parts += [f'<figure><img alt="{stem}" src="data:image/png;base64,{b64}"><figcaption>{stem}</figcaption></figure>'
              for stem, b64 in images]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>ragpool run "
            f"{html.escape(run_id)}</title><style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}"
            "td:first-child,th:first-child{text-align:left}img{max-width:100%}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
    return page, pngs


def render(shared_root: str | Path, run_id: str) -> Path:
    """Write ``report.html`` and the PNGs for ``run_id`` into its run directory; return the HTML path."""
    page, pngs = build(shared_root, run_id)
    run_dir = run_dir_of(shared_root, run_id)
    plots_dir = run_dir / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)
    for stem, png in pngs.items():
        (plots_dir / f"{stem}.png").write_bytes(png)
    out = run_dir / REPORT_HTML
    out.write_text(page, encoding="utf-8")
    return out
