"""A W&B workspace (what `python -m specexp.dashboard` saves) that compares
drafts across the runs `logger=wandb` writes, built with wandb-workspaces.

Runs are grouped by study (W&B group = experiment_name) and draft (job_type), as the logger
tags them, so every line below is one draft of one study:
- speedup against K (each run logs one history row with x = k);
- acceptance curves (each run logs one row per draft position, x = position);
- tau and speedup per prompt category (the `per_category` table of every run);
- the alpha/c plane (summary alpha against summary cost_ratio_c);
- pairing (experiment=pairing): speedup by target x draft, a parallel-coordinates line per run from
  its target through its draft to its speedup and alpha;
- a runs table: target, draft, K, temperature, data, alpha, tau, speedup, realized/predicted.
"""

from dataclasses import dataclass

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws


@dataclass(frozen=True)
class Key:
    """A value the dashboard reads from each run: where W&B keeps it, and its name there."""

    section: str  # history | summary | config | table | run
    name: str


# The runs table's columns, in W&B's "section:name" form: what each run is, then its numbers.
RUN_COLUMNS = ["config:choice.target", "run:jobType", "config:draft.k", "config:sampling.temperature",
               "config:choice.data", "summary:alpha", "summary:tau", "summary:speedup", "summary:speedup_ci95_lo",
               "summary:speedup_ci95_hi", "summary:realized_over_predicted"]


def per_category_bars(metric: str) -> wr.CustomChart:
    """W&B's bar preset over every run's `per_category` table (category, alpha, tau, speedup)."""
    return wr.CustomChart(query={"summaryTable": {"tableKey": "per_category"}}, chart_name="wandb/bar/v0",
                          chart_fields={"label": "category", "value": metric},
                          chart_strings={"title": f"{metric} per category"})


def sections() -> list[ws.Section]:
    grouped = {"groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"}
    return [
        ws.Section(name="Speedup and acceptance", is_open=True, panels=[
            wr.LinePlot(title="speedup over AR against K (with its 95% interval's ends)", x="k_max",
                        y=["speedup", "speedup_ci95_lo", "speedup_ci95_hi"], title_x="K", title_y="speedup", **grouped),
            wr.LinePlot(title="P(accept position i | earlier accepted)", x="position", y=["acceptance"],
                        title_x="draft position i", title_y="acceptance", **grouped),
            wr.ScatterPlot(title="alpha against draft cost c (the cost/quality plane)",
                           x=wr.SummaryMetric("cost_ratio_c"), y=wr.SummaryMetric("alpha")),
        ]),
        ws.Section(name="Per category", is_open=True, panels=[
            per_category_bars("speedup"),
            per_category_bars("tau"),
        ]),
        ws.Section(name="Pairing", is_open=True, panels=[
            wr.ParallelCoordinatesPlot(title="speedup by target x draft", columns=[
                wr.ParallelCoordinatesPlotColumn(metric=wr.Config("choice.target"), display_name="target"),
                wr.ParallelCoordinatesPlotColumn(metric=wr.Config("choice.draft"), display_name="draft"),
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("speedup"), display_name="speedup"),
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("alpha"), display_name="alpha")]),
        ]),
    ]


def build_workspace(project: str, entity: str, group: str | None = None, name: str | None = None) -> ws.Workspace:
    filters = [ws.Metric("Group") == group] if group else []
    return ws.Workspace(
        entity=entity, project=project, name=name or f"specexp: drafts compared{f' ({group})' if group else ''}",
        sections=sections(),
        settings=ws.WorkspaceSettings(x_axis="Step", max_runs=100),
        runset_settings=ws.RunsetSettings(groupby=[ws.Metric("Group"), ws.Metric("JobType")], filters=filters,
                                          pinned_columns=list(RUN_COLUMNS)),
    )


def _metric_key(metric, default_section: str) -> Key:
    if isinstance(metric, wr.SummaryMetric):
        return Key("summary", metric.name)
    if isinstance(metric, wr.Config):
        return Key("config", metric.name)
    return Key(default_section, metric if isinstance(metric, str) else metric.name)


def referenced_keys(workspace: ws.Workspace) -> set[Key]:
    """Every run value the workspace's panels, table and grouping read."""
    keys = set()
    for section in workspace.sections:
        for panel in section.panels:
            if isinstance(panel, wr.LinePlot):
                keys |= {_metric_key(panel.x, "history")} | {_metric_key(y, "history") for y in panel.y}
            elif isinstance(panel, wr.ScatterPlot):
                keys |= {_metric_key(panel.x, "summary"), _metric_key(panel.y, "summary")}
            elif isinstance(panel, wr.ParallelCoordinatesPlot):
                keys |= {_metric_key(column.metric, "summary") for column in panel.columns}
            elif isinstance(panel, wr.CustomChart):
                table = panel.query["summaryTable"]["tableKey"]
                keys |= {Key("table", table)} | {Key(f"table:{table}", c) for c in panel.chart_fields.values()}
    keys |= {Key(*column.split(":", 1)) for column in workspace.runset_settings.pinned_columns}
    keys |= {Key("run", {"Group": "group", "JobType": "jobType"}[g.name]) for g in workspace.runset_settings.groupby}
    return keys


def describe(workspace: ws.Workspace) -> str:
    lines = [f"workspace '{workspace.name}' in {workspace.entity}/{workspace.project}",
             "  runs grouped by study (group) and draft (job_type)"
             + (f", filtered to {workspace.runset_settings.filters}" if workspace.runset_settings.filters else "")]
    for section in workspace.sections:
        lines.append(f"  section '{section.name}':")
        for panel in section.panels:
            title = panel.chart_strings.get("title") if isinstance(panel, wr.CustomChart) else panel.title
            lines.append(f"    {type(panel).__name__}: {title}")
    lines.append(f"  runs table: {', '.join(workspace.runset_settings.pinned_columns)}")
    return "\n".join(lines)
