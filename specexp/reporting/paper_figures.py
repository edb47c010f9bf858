"""The paper figures of a sweep (what `python -m specexp.figures` writes): which figures the finished jobs
support (the plan), each drawn by reporting/plots.py from the tables of reporting/figure_tables.py, and the
headline table.

Reads study jobs (summary.json + rounds.parquet) and distillation runs (result.json + metrics.jsonl);
writes each figure as vector PDF and PNG and the headline numbers as markdown and LaTeX (booktabs).
"""

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on clusters or in CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specexp.output import markdown_table  # noqa: E402
from specexp.reporting import plots  # noqa: E402
from specexp.reporting.figure_tables import (  # noqa: E402
    acceptance_by_position,
    finished_studies,
    per_prompt_table,
    validations,
    with_pairing_predictions,
)
from specexp.reporting.job_profiles import model_curves, plane_pricing  # noqa: E402
from specexp.reporting.job_table import collect  # noqa: E402


def plan(jobs: pd.DataFrame, history: pd.DataFrame) -> list[tuple[str, Callable[[], plt.Figure] | None, str]]:
    """(figure name, how to draw it or None, why it is skipped)."""
    has_jobs = not jobs.empty
    ks = jobs.groupby("draft")["k"].nunique().max() if has_jobs else 0
    categories = [c for c in jobs.columns if c.startswith("tau.")] if has_jobs else []

    def when(condition: bool, draw: Callable[[], plt.Figure], why: str):
        return (draw, "") if condition else (None, why)

    no_jobs = "no finished study jobs (summary.json + rounds.parquet)"
    return [
        ("acceptance_curve", *when(has_jobs and bool((jobs.get("k_max", jobs.get("k")) >= 1).any())
                                   and jobs["alpha"].notna().any(),
                                   lambda: plots.acceptance_curve(acceptance_by_position(jobs)),
                                   no_jobs + " that drafted (draft.k=auto may choose AR steps throughout)")),
        ("speedup_vs_k", *when(ks >= 2, lambda: plots.speedup_vs_k(jobs, per_prompt_table(jobs), *model_curves(jobs)),
                               "needs a draft measured at 2 or more K (experiment=k_sweep)")),
        ("tree_budget", *when(has_jobs and (jobs["branches"] > 1).any() and jobs["k"].nunique() >= 2,
                              lambda: plots.tree_budget(jobs),
                              "needs token trees (draft.branches > 1) at 2 or more node budgets "
                              "(experiment=tree_sweep)")),
        ("cost_quality_plane", *when(has_jobs and jobs["cost_ratio_c"].notna().any(),
                                     lambda: plots.cost_quality_plane(jobs, *plane_pricing(jobs)),
                                     no_jobs + " with a measured c")),
        ("realized_vs_predicted", *when(has_jobs and "predicted_speedup" in jobs
                                        and jobs["predicted_speedup"].notna().any(),
                                        lambda: plots.realized_vs_predicted(jobs),
                                        no_jobs + " priced by the cost model (predicted_speedup)")),
        ("pairing_matrix", *when(has_jobs and jobs["target"].nunique() >= 2, lambda: plots.pairing_matrix(jobs),
                                 "needs 2 or more targets (experiment=pairing)")),
        ("pairing_scatter", *when(has_jobs and jobs["target"].nunique() >= 2
                                  and jobs.get(plots.predicted_column(jobs), pd.Series(dtype=float)).notna().any(),
                                  lambda: plots.pairing_scatter(jobs),
                                  "needs 2 or more targets priced by the cost model (experiment=pairing)")),
        ("tau_by_category", *when(len(categories) >= 2, lambda: plots.category_heatmap(jobs, "tau"),
                                  "needs per-category results in 2 or more categories")),
        ("temperature_effect", *when(has_jobs and jobs["temperature"].nunique() >= 2,
                                     lambda: plots.effect_of(jobs, "temperature", "temperature"),
                                     "needs 2 or more temperatures (experiment=temperature_sweep)")),
        ("batch_effect", *when(has_jobs and jobs["batch_size"].nunique() >= 2,
                               lambda: plots.effect_of(jobs, "batch_size", "batch size"),
                               "needs 2 or more batch sizes (experiment=batch_sweep)")),
        ("exit_layer_effect", *when(has_jobs and jobs["exit_layer"].nunique() >= 2,
                                    lambda: plots.effect_of(jobs.dropna(subset=["exit_layer"]), "exit_layer",
                                                            "exit layer L"),
                                    "needs 2 or more exit layers (experiment=exit_layer_sweep)")),
        ("distillation_alpha", *when(not history.empty, lambda: plots.distillation_curves(
            history, style="student" if history.get("student", pd.Series(dtype=str)).nunique() > 1 else None),
                                     "no distillation runs (result.json + metrics.jsonl)")),
    ]


def write_headline(jobs: pd.DataFrame, out: Path) -> None:
    table = plots.headline_table(jobs)
    (out / "headline.md").write_text(markdown_table(table))
    latex = table.style.hide(axis="index").format(precision=3, na_rep="--").to_latex(hrules=True)  # booktabs rules
    (out / "headline.tex").write_text(latex)


def make_figures(paths: list[Path], out: Path) -> tuple[list[str], dict[str, str]]:
    """Writes what the data supports under out; returns (written files, {skipped figure: why})."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"'{missing[0]}' does not exist")
    table = collect(paths)  # every job folder read once
    jobs, history = with_pairing_predictions(finished_studies(table), paths), validations(table)
    out.mkdir(parents=True, exist_ok=True)
    plots.paper_theme()
    written, skipped = [], {}
    for name, draw, why in plan(jobs, history):
        if draw is None:
            skipped[name] = why
            continue
        fig = draw()
        for suffix in ("pdf", "png"):
            fig.savefig(out / f"{name}.{suffix}")
            written.append(f"{name}.{suffix}")
        plt.close(fig)
    if jobs.empty:
        skipped["headline table"] = "no finished study jobs"
    else:
        write_headline(jobs, out)
        written += ["headline.md", "headline.tex"]
    return written, skipped
