"""Tables for people: the summary printed at the end of a run (rich), and markdown tables."""

from pathlib import Path

from rich.console import Console
from rich.table import Table

from specexp.study.intervals import fmt_interval
from specexp.study.summary import k_max_of, keys


def fmt(value) -> str:
    """A metric for a line of text: 3 decimals, '-' where there is none (alpha of a run that never drafted)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def with_interval(summary: dict, key: str) -> str:
    """A headline metric with its 95% interval when the summary has one: '1.120 [1.050, 1.190]'."""
    if summary.get(key) is None:
        return "-"
    return fmt_interval(summary[key], summary.get(f"{key}_ci95"), note=(summary.get("interval_notes") or {}).get(key))


def done_line(label: str, summary: dict) -> str:
    """A multirun job's one line: alpha, tau and speedup with their intervals ('-' for alpha when
    nothing was drafted)."""
    return f"[done] {label}: " + " ".join(f"{key}={with_interval(summary, key)}" for key in keys(interval=True))


def print_summary(summary: dict, out_dir: Path | None = None, console: Console | None = None) -> None:
    console = console or Console()
    k = (k_max_of(summary) if summary.get("k_policy", "fixed") == "fixed"
         else f"{summary['k_policy']} (<= {k_max_of(summary)})")
    table = Table(title=f"{summary.get('draft')} on {summary.get('target')}, K={k}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in keys(shown=True):
        scalar_ci = f"{key}_ci95" in summary and not isinstance(summary.get(key), list)
        value = with_interval(summary, key) if scalar_ci else fmt(summary.get(key))
        table.add_row(key + (" [95% CI]" if scalar_ci else ""), value)
    timing = summary.get("timing") or {}
    if timing:
        table.add_row("timing passes per batch", str(timing.get("passes")))
    console.print(table)
    if summary.get("per_category"):
        per_cat = Table(title="per category")
        for column in ("category", "alpha", "tau", "speedup"):
            per_cat.add_column(column, justify="left" if column == "category" else "right")
        for cat, values in summary["per_category"].items():
            per_cat.add_row(cat, fmt(values["alpha"]), fmt(values["tau"]), fmt(values["speedup"]))
        console.print(per_cat)
    if out_dir is not None:
        console.print(f"results: {out_dir}")
