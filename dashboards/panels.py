"""Small typed panel and dashboard helpers over grafana-foundation-sdk, with shared defaults.

Every panel queries the dashboard's ``$datasource`` variable (a Prometheus data source),
so the JSON imports into any Grafana without editing. Panel ids and grid positions are
assigned in order by :func:`dashboard`, so the output depends only on the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar, Union

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m

DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Tags every ragpool dashboard carries (Grafana search and dashboard links use them).
BASE_TAGS = ("ragpool",)
FULL_WIDTH = 24

PanelBuilder = Union[ts_b.Panel, stat_b.Panel, table_b.Panel]
_Panel = TypeVar("_Panel", ts_b.Panel, stat_b.Panel, table_b.Panel)


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel."""

    expr: str
    """PromQL; Grafana variables only inside strings, macros like ``$__rate_interval``."""
    legend: str = ""
    """Legend template (``{{label}}``); empty = Grafana's default series name."""
    instant: bool = False
    """Instant query (tables and stats of the current value) instead of a range."""


@dataclass(frozen=True)
class Row:
    """A titled row and the panels under it."""

    title: str
    panels: Sequence[PanelBuilder]
    repeat: str | None = None
    """A dashboard variable: Grafana repeats the row (and its panels) once per selected value."""
    collapsed: bool = False
    """Folded when the dashboard opens: its panels (nested in the row) query only once unfolded."""


def _target(query: Query, ref_id: str) -> prom_b.Dataquery:
    target = prom_b.Dataquery().expr(query.expr).ref_id(ref_id).datasource(DATASOURCE)
    if query.legend:
        target = target.legend_format(query.legend)
    if query.instant:
        # Table format: one row per series with its labels as columns.
        return target.instant().format(prom_m.PromQueryFormat.TABLE)
    return target.range()


def _targets(panel, queries: Sequence[Query]):
    if not queries:
        raise ValueError("a panel needs at least one query")
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, chr(ord("A") + index)))
    return panel


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dash_b.ThresholdsConfig:
    return dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(
        [dash_m.Threshold(value=value, color=color) for value, color in steps]
    )


def _panel(builder: _Panel, title: str, description: str, unit: str, width: int, height: int) -> _Panel:
    """What every panel sets alike: title, description, the ``$datasource``, unit and size."""
    return builder.title(title).description(description).datasource(DATASOURCE).unit(unit).span(width).height(height)


def timeseries(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str,
    description: str,
    width: int = 12,
    height: int = 8,
    min_value: float | None = None,
    max_value: float | None = None,
    stacked: bool = False,
) -> ts_b.Panel:
    """A time series panel: legend as a table below, shared tooltip, no points."""
    panel = (
        _panel(ts_b.Panel(), title, description, unit, width, height)
        .line_width(1)
        .fill_opacity(10 if not stacked else 60)
        .show_points(common_m.VisibilityMode.NEVER)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common_m.LegendDisplayMode.TABLE)
            .placement(common_m.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI).sort(common_m.SortOrder.DESCENDING))
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if stacked:
        panel = panel.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL))
    return _targets(panel, queries)


def stat(
    title: str,
    query: Query,
    *,
    unit: str,
    description: str,
    width: int = 6,
    height: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
) -> stat_b.Panel:
    """A single-value panel of the last value, coloured by ``thresholds``."""
    panel = (
        _panel(stat_b.Panel(), title, description, unit, width, height)
        .graph_mode(common_m.BigValueGraphMode.AREA)
        .color_mode(common_m.BigValueColorMode.VALUE)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(_thresholds(thresholds))
    )
    return _targets(panel, [query])


def table(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str,
    description: str,
    width: int = 12,
    height: int = 8,
) -> table_b.Panel:
    """A table of instant query results, one row per series (labels as columns)."""
    panel = (
        _panel(table_b.Panel(), title, description, unit, width, height)
        .show_header(True)
        .with_transformation(dash_m.DataTransformerConfig(id_val="merge", options={}))
    )
    for query in queries:
        if not query.instant:
            raise ValueError(f"table {title!r}: queries must be instant")
    return _targets(panel, queries)


def datasource_variable() -> dash_b.DatasourceVariable:
    return dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, query: str, *, multi: bool = True) -> dash_b.QueryVariable:
    """A variable filled by ``query`` (Grafana's ``label_values(selector, label)``), All allowed."""
    return (
        dash_b.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(True)
    )


def dashboard(
    uid: str,
    title: str,
    *,
    description: str,
    tags: Sequence[str],
    variables: Sequence[dash_b.QueryVariable],
    rows: Sequence[Row],
) -> dash_m.Dashboard:
    """A dashboard with shared defaults: the ``$datasource`` variable first, last 6 hours,
    1-minute refresh, UTC, shared crosshair, links to the other ragpool dashboards."""
    board = (
        dash_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(sorted(set(BASE_TAGS) | set(tags)))
        .editable()
        .timezone("utc")
        .time("now-6h", "now")
        .refresh("1m")
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .with_variable(datasource_variable())
        .link(
            dash_b.DashboardLink("ragpool")
            .type(dash_m.DashboardLinkType.DASHBOARDS)
            .tags(list(BASE_TAGS))
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for variable in variables:
        board = board.with_variable(variable)
    panel_id = 1
    for row in rows:
        row_builder = dash_b.Row(row.title).id(panel_id)
        if row.repeat:
            row_builder = row_builder.repeat(row.repeat)
        panel_id += 1
        if row.collapsed:  # a collapsed row holds its panels
            row_builder = row_builder.collapsed(True)
            for panel in row.panels:
                row_builder = row_builder.with_panel(panel.id(panel_id))
                panel_id += 1
            board = board.with_row(row_builder)
            continue
        board = board.with_row(row_builder)
        for panel in row.panels:
            board = board.with_panel(panel.id(panel_id))
            panel_id += 1
    return board.build()
