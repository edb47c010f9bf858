"""Paper figures from collected sweep tables (seaborn + matplotlib).

Every function takes DataFrames made by `specexp.reporting.job_table` / `specexp.reporting.figure_tables` and returns a
matplotlib Figure; none saves or shows. Inputs:
- `jobs`: one row per job (`choice.draft`, `cfg.draft.k`, `alpha`, `cost_ratio_c`, `speedup`, ...);
- `prompts`: one row per (job, prompt) (`per_prompt_table`), for intervals over prompts;
- `positions`: one row per (job, prompt, draft position) (`acceptance_by_position`);
- `history`: one row per (distillation run, validation) (`step`, `val/alpha`, `objective`).
"""

from collections.abc import Iterable
from itertools import groupby

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from specexp.core import metrics
from specexp.costs.cost_model import best_speedup_on
from specexp.drafts.registry import draft_names
from specexp.study.intervals import column_interval, fmt_bounds

COLUMN_WIDTH_IN = 3.3  # one column of a two-column paper
# Fixed draft order -> fixed colours: a draft keeps its colour in every figure of a paper.


def paper_theme() -> None:
    """Small fonts for column width, vector text in PDFs, a white grid."""
    sns.set_theme(context="paper", style="whitegrid", font_scale=0.9)
    matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "savefig.bbox": "tight", "savefig.dpi": 300,
                                "figure.dpi": 100, "legend.frameon": False})


def draft_palette(drafts: Iterable[str], declared: dict[str, str] | None = None) -> dict[str, tuple]:
    """Colours stable per draft across figures: the colour a draft's card declares (``declared``:
    label -> colour, `declared_colours`), else a registered draft's from the colour-blind-safe set
    (then a darker set past its ten), unknown ones after them; labels of one draft's variants
    (early_exit/HEAD/MODE) take shades of that draft's colour."""
    colors = sns.color_palette("colorblind", 10) + sns.color_palette("dark", 10)
    labels = sorted(set(drafts), key=lambda label: (label.split("/")[0], label))
    registered = draft_names()
    bases = registered + sorted({label.split("/")[0] for label in labels} - set(registered))
    base_color = {base: colors[i % len(colors)] for i, base in enumerate(bases)}
    base_color |= {label.split("/")[0]: matplotlib.colors.to_rgb(c) for label, c in (declared or {}).items()}
    palette = {}
    for base, variants in groupby(labels, key=lambda label: label.split("/")[0]):
        variants = list(variants)
        shades = [base_color[base]] if len(variants) == 1 else sns.dark_palette(base_color[base], len(variants) + 1)[1:]
        palette |= dict(zip(variants, shades, strict=True))
    return palette


def declared_colours(frame: pd.DataFrame) -> dict[str, str]:
    """label -> the colour its draft's card declares, from a table's `draft_colour` column (figures.py)."""
    if "draft_colour" not in frame:
        return {}
    return {d: c for d, c in zip(frame["draft"], frame["draft_colour"], strict=True) if isinstance(c, str) and c}


def palette_of(frame: pd.DataFrame) -> dict[str, tuple]:
    """`draft_palette` of a table's drafts, with the colours their cards declare."""
    return draft_palette(frame["draft"], declared_colours(frame))


def _figure(height: float = 2.3, width: float = COLUMN_WIDTH_IN, ncols: int = 1) -> tuple[Figure, list]:
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False, layout="constrained")
    return fig, list(axes.ravel())


def analytical_speedup(a: float, k: np.ndarray, c: float) -> np.ndarray:
    """Leviathan et al.'s i.i.d. speedup (1 - a^(K+1)) / ((1 - a)(K c + 1)) for an array of K."""
    k = np.asarray(k, dtype=float)
    return metrics.expected_tokens_per_round(a, k) / (k * c + 1)


def optimal_k(a: float, c: float, k_max: int = 32) -> int:
    """The K in 1..k_max with the highest i.i.d. speedup (the smallest on ties)."""
    ks = np.arange(1, k_max + 1)
    return int(ks[np.argmax(analytical_speedup(a, ks, c))])


def interval_errors(rows: pd.DataFrame, metric: str) -> np.ndarray | None:
    """Error bars [2, n] (below, above) from the jobs' 95% intervals (`METRIC_ci95_lo/hi`, specexp.reporting.job_table);
    None when the table has none (jobs written before intervals)."""
    lo, hi = f"{metric}_ci95_lo", f"{metric}_ci95_hi"
    if lo not in rows or rows[lo].isna().all():
        return None
    value = rows[metric].to_numpy(dtype=float)
    return np.stack([value - rows[lo].to_numpy(dtype=float), rows[hi].to_numpy(dtype=float) - value]).clip(min=0)


def job_errorbars(ax, jobs: pd.DataFrame, x: str, metric: str, palette: dict, label: bool = True, **style) -> bool:
    """Each job's metric at x with its 95% interval as an error bar, a colour per draft; False if the
    jobs carry no intervals (nothing drawn)."""
    if interval_errors(jobs, metric) is None:
        return False
    for draft, rows in jobs.sort_values(x).groupby("draft"):
        ax.errorbar(rows[x], rows[metric], yerr=np.nan_to_num(interval_errors(rows, metric)), color=palette[draft],
                    label=draft if label else "_", capsize=1.5, elinewidth=0.8,
                    **({"fmt": "o", "markersize": 3} | style))
    return True


def acceptance_curve(positions: pd.DataFrame) -> Figure:
    """P(accept at draft position i | earlier accepted), per draft, 95% CI over prompts."""
    fig, (ax,) = _figure()
    sns.lineplot(data=positions, x="position", y="acceptance", hue="draft", marker="o", errorbar=("ci", 95),
                 palette=palette_of(positions), ax=ax)
    ax.set(xlabel="draft position i", ylabel="P(accept i | 1..i-1 accepted)", ylim=(0, 1.02))
    ax.xaxis.get_major_locator().set_params(integer=True)
    return fig


def speedup_vs_k(jobs: pd.DataFrame, prompts: pd.DataFrame | None = None, model: pd.DataFrame | None = None,
                 model_label: str | None = None) -> Figure:
    """Measured speedup per K with each job's 95% interval (`speedup_ci95`: batches and repeated
    timings; for tables without it, the mean and 95% CI over `prompts`, else the job totals), the
    calibrated model's curve per draft (`model`: draft, k, speedup; `specexp.costs.cost_model` priced
    with the runs' hardware profile, named by `model_label`), its best K starred, and Leviathan
    et al.'s i.i.d. curve from the measured alpha and c, dashed."""
    fig, (ax,) = _figure()
    fixed = jobs.dropna(subset=["k"])
    palette = palette_of(jobs)
    if not job_errorbars(ax, fixed, "k", "speedup", palette):
        sns.pointplot(data=fixed if prompts is None else prompts.dropna(subset=["k"]), x="k", y="speedup", hue="draft",
                      native_scale=True, errorbar=None if prompts is None else ("ci", 95), palette=palette,
                      linestyle="none", markers="o", markersize=3, err_kws={"linewidth": 1}, ax=ax)
    k_max = int(fixed["k"].max())
    ks = np.linspace(1, k_max, 200)
    iid_labelled = False
    for draft, rows in fixed.groupby("draft"):
        a, c = rows["alpha"].mean(), rows["cost_ratio_c"].mean()
        if np.isnan(a) or np.isnan(c):
            continue
        ax.plot(ks, analytical_speedup(a, ks, c), color=palette[draft], linewidth=0.8, alpha=0.6, linestyle="--",
                label="_" if iid_labelled else "i.i.d. model (Leviathan)")
        iid_labelled = True
    model_labelled = False
    for draft, curve in (model.groupby("draft") if model is not None else ()):
        curve = curve.sort_values("k")
        ax.plot(curve["k"], curve["speedup"], color=palette.get(draft, "0.3"), linewidth=1.2,
                label="_" if model_labelled else f"cost model ({model_label})" if model_label else "cost model")
        model_labelled = True
        best = curve.loc[curve["speedup"].idxmax()]
        ax.plot([best["k"]], [best["speedup"]], marker="*", markersize=8, color=palette.get(draft, "0.3"),
                linestyle="none", label=f"_{draft} optimum")
    chosen = jobs[jobs["k"].isna()] if {"mean_k", "k_label"} <= set(jobs) else pd.DataFrame()  # K chosen per round
    for (draft, policy), rows in (chosen.groupby(["draft", "k_label"]) if len(chosen) else ()):  # at its mean K
        ax.scatter(rows["mean_k"], rows["speedup"], marker="D" if policy == "auto" else "s", s=14,
                   facecolors="none", edgecolors=palette.get(draft, "0.3"), zorder=4, label=f"K={policy} ({draft})")
    ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle=":")
    ax.set(xlabel="K (draft tokens per round; K chosen per round: its mean)", ylabel="speedup over AR")
    ax.legend(fontsize=4)
    return fig


def tree_budget(jobs: pd.DataFrame) -> Figure:
    """Tokens per target pass (tau) and speedup against the node budget (draft.k: draft tokens one
    pass verifies), a colour per draft and a line style per branching (1: a chain); beside each
    measured speedup, thin with + markers, the calibrated cost model's prediction for the same job."""
    fig, axes = _figure(ncols=2, width=2 * COLUMN_WIDTH_IN)
    fixed = jobs.dropna(subset=["k"]).sort_values("k")
    palette = palette_of(fixed)
    for ax, metric, name in zip(axes, ("tau", "speedup"), (r"$\tau$ (tokens per target pass)", "speedup over AR"),
                                strict=True):
        sns.lineplot(data=fixed, x="k", y=metric, hue="draft", style="branches", markers=True, errorbar=None,
                     palette=palette, ax=ax, legend=metric == "speedup")
        ax.set(xlabel="node budget (draft tokens per pass)", ylabel=name, xscale="log", ylim=(0, None))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xticks(sorted(fixed["k"].unique()))
    job_errorbars(axes[1], fixed, "k", "speedup", palette, label=False, fmt="none")  # each job's 95% interval
    predicted = fixed.dropna(subset=["predicted_speedup"]) if "predicted_speedup" in fixed else fixed.iloc[:0]
    labelled = False
    for (draft, _), rows in predicted.groupby(["draft", "branches"]):
        axes[1].plot(rows["k"], rows["predicted_speedup"], color=palette[draft], linewidth=0.6, alpha=0.6, marker="+",
                     markersize=5, label="_" if labelled else "cost model (each job)")
        labelled = True
    axes[1].axhline(1.0, color="0.4", linewidth=0.8, linestyle=":")
    axes[1].legend(fontsize=5)
    return fig


def cost_quality_plane(jobs: pd.DataFrame, pass_ratios: np.ndarray | None = None, overhead_ratio: float = 0.0,
                       profile_label: str | None = None, k_max: int = 32) -> Figure:
    """Each draft at (c, alpha) over iso-speedup contours at the best K, priced on the hardware:
    `pass_ratios[n-1]` = T(n)/T(1) from the runs' profile (none: every pass priced as one AR step,
    Leviathan's plane). A draft sits at its equivalent alpha (`alpha_equivalent`: the i.i.d. rate
    giving its measured tokens per round) when the table has it, so its contour reads its speedup."""
    fig, (ax,) = _figure(height=2.6)
    y = "alpha_equivalent" if "alpha_equivalent" in jobs and jobs["alpha_equivalent"].notna().any() else "alpha"
    per_draft = jobs.groupby("draft")[[y, "cost_ratio_c"]].mean().dropna()
    c_max = max(0.5, float(per_draft["cost_ratio_c"].max()) * 1.2) if len(per_draft) else 0.5
    cs, alphas = np.linspace(0, c_max, 120), np.linspace(0.0, 0.99, 120)
    C, A = np.meshgrid(cs, alphas)
    ratios = np.ones(k_max + 1) if pass_ratios is None else np.asarray(pass_ratios)
    levels = [0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0]
    contours = ax.contour(C, A, best_speedup_on(ratios, overhead_ratio, A, C), levels=levels, colors="0.55",
                          linewidths=0.7)
    ax.clabel(contours, fmt=lambda v: f"{v:g}x", fontsize=6)
    palette = draft_palette(per_draft.index, declared_colours(jobs))
    for draft, row in per_draft.iterrows():
        ax.scatter(row["cost_ratio_c"], row[y], color=palette[draft], s=25, zorder=3, label=draft)
    ylabel = r"equivalent $\alpha$ (i.i.d. rate of its tokens/round)" if y == "alpha_equivalent" \
        else r"$\alpha$ (acceptance rate)"
    ax.set(xlabel="c (draft cost per token / target step)", ylabel=ylabel, xlim=(0, c_max), ylim=(0, 1))
    ax.set_title(f"contours: cost model on {profile_label}" if profile_label else "contours: i.i.d. model, T(n) = T(1)",
                 fontsize=6)
    ax.legend(loc="lower right", fontsize=6)
    return fig


def realized_vs_predicted(jobs: pd.DataFrame) -> Figure:
    """Each job's measured speedup against the cost model's prediction, the identity line and a
    10% band around it: how far the model can be trusted on this hardware."""
    fig, (ax,) = _figure(height=2.6)
    priced = jobs.dropna(subset=["predicted_speedup", "speedup"])
    low = min(priced[["predicted_speedup", "speedup"]].min().min(), 1.0) * 0.9
    high = max(priced[["predicted_speedup", "speedup"]].max().max(), 1.0) * 1.1
    line = np.array([low, high])
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.9", zorder=0, label="within 10%")
    ax.plot(line, line, color="0.4", linewidth=0.8, linestyle="--", label="realized = predicted")
    palette = palette_of(priced)
    sns.scatterplot(data=priced, x="predicted_speedup", y="speedup", hue="draft", palette=palette, s=18, ax=ax,
                    zorder=3)
    # measured 95% intervals
    job_errorbars(ax, priced, "predicted_speedup", "speedup", palette, label=False, fmt="none")
    ax.set(xlabel="predicted speedup (cost model)", ylabel="realized speedup", xlim=(low, high), ylim=(low, high))
    ax.legend(fontsize=5)
    return fig


def category_heatmap(jobs: pd.DataFrame, metric: str = "tau") -> Figure:
    """metric (tau or speedup) per draft x prompt category (columns `{metric}.{category}`)."""
    columns = [c for c in jobs.columns if c.startswith(f"{metric}.")]
    grid = jobs.groupby("draft")[columns].mean()
    grid.columns = [c.split(".", 1)[1] for c in columns]
    fig, (ax,) = _figure(height=0.45 * len(grid) + 1.2, width=max(COLUMN_WIDTH_IN, 0.5 * len(grid.columns) + 1.5))
    sns.heatmap(grid, annot=True, fmt=".2f", cmap="viridis", cbar_kws={"label": metric}, ax=ax, annot_kws={"size": 6})
    ax.set(xlabel="prompt category", ylabel="draft")
    return fig


def predicted_column(jobs: pd.DataFrame) -> str:
    """The prediction a pairing figure shows: the one made before decoding (`python -m specexp.pairing`,
    merged as `pairing_predicted_speedup`) where the jobs have it, else the cost model's of the run."""
    return "pairing_predicted_speedup" if jobs.get("pairing_predicted_speedup", pd.Series(dtype=float)).notna().any() \
        else "predicted_speedup"


def pairing_cells(jobs: pd.DataFrame, setting: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One setting's (data, temperature) jobs as a target x draft grid of ``metric`` and of its cell labels
    (the value, its 95% interval, and for speedup the prediction); empty where no job finished."""
    cols = sorted(jobs["draft"].unique())
    grid = setting.pivot_table(index="target", columns="draft", values=metric, aggfunc="first").reindex(columns=cols)
    labels = pd.DataFrame("", index=grid.index, columns=cols)
    for row in setting.itertuples():
        value = getattr(row, metric)
        if pd.isna(value):
            continue
        lo, hi = getattr(row, f"{metric}_ci95_lo", None), getattr(row, f"{metric}_ci95_hi", None)
        text = f"{value:.2f}" + (f"\n[{lo:.2f}, {hi:.2f}]" if pd.notna(lo) and pd.notna(hi) else "")
        predicted = getattr(row, predicted_column(jobs), None)
        if metric == "speedup" and pd.notna(predicted):
            text += f"\npred {predicted:.2f}"
        labels.loc[row.target, row.draft] = text
    return grid, labels


def pairing_matrix(jobs: pd.DataFrame) -> Figure:
    """Which draft for which target: per setting (data set, temperature) a target x draft heatmap of the
    measured speedup over AR (its 95% interval and the prediction, `predicted_column`, in each cell) beside one
    of alpha. A blank cell: the pair was skipped (its draft does not apply) or did not finish."""
    settings = list(jobs.groupby(["data", "temperature"]))
    n_targets, n_drafts = jobs["target"].nunique(), jobs["draft"].nunique()
    height = (0.55 * n_targets + 0.9) * len(settings)
    fig, axes = plt.subplots(len(settings), 2, figsize=(2 * max(COLUMN_WIDTH_IN, 0.75 * n_drafts + 1.2), height),
                             squeeze=False, layout="constrained")
    for (data, temperature), setting in settings:
        row = [key for key, _ in settings].index((data, temperature))
        for ax, metric, cmap, center in zip(axes[row], ("speedup", "alpha"), ("vlag", "viridis"), (1.0, None),
                                            strict=True):
            grid, labels = pairing_cells(jobs, setting, metric)
            ax.set(title=f"{data}, T = {temperature:g}", xlabel="draft", ylabel="target")
            if grid.isna().all().all():  # alpha of jobs that never drafted (draft.k=auto chose AR steps)
                ax.text(0.5, 0.5, f"no {metric} measured", ha="center", va="center", transform=ax.transAxes)
                continue
            sns.heatmap(grid, annot=labels, fmt="", cmap=cmap, center=center, ax=ax, annot_kws={"size": 4.5},
                        cbar_kws={"label": "speedup over AR" if metric == "speedup" else r"$\alpha$"}, linewidths=0.5)
            ax.grid(False)  # a blank (skipped) cell stays blank
            ax.tick_params(axis="x", labelrotation=45, labelsize=5)
            ax.tick_params(axis="y", labelrotation=0, labelsize=6)
    return fig


def pairing_scatter(jobs: pd.DataFrame) -> Figure:
    """Every (target, draft, setting) cell: measured speedup (95% interval) against the prediction
    (`predicted_column`), a colour per draft and a marker per target, with y = x."""
    fig, (ax,) = _figure(height=2.6)
    x = predicted_column(jobs)
    priced = jobs.dropna(subset=[x, "speedup"])
    low = min(priced[[x, "speedup"]].min().min(), 1.0) * 0.9
    high = max(priced[[x, "speedup"]].max().max(), 1.0) * 1.1
    ax.plot([low, high], [low, high], color="0.4", linewidth=0.8, linestyle="--", label="y = x")
    palette = palette_of(priced)
    sns.scatterplot(data=priced, x=x, y="speedup", hue="draft", style="target", palette=palette, s=18, ax=ax, zorder=3)
    job_errorbars(ax, priced, x, "speedup", palette, label=False, fmt="none")
    label = ("predicted before decoding" if x == "pairing_predicted_speedup"
             else "predicted (cost model, measured alpha)")
    ax.set(xlabel=label, ylabel="measured speedup", xlim=(low, high), ylim=(low, high))
    ax.legend(fontsize=5)
    return fig


def effect_of(jobs: pd.DataFrame, factor: str, label: str) -> Figure:
    """alpha and speedup against one factor (`temperature`, `batch_size`, `exit_layer`), a line per
    draft, averaged over the other factors (with a 95% CI)."""
    fig, axes = _figure(ncols=2, width=2 * COLUMN_WIDTH_IN)
    palette = palette_of(jobs)
    one_job_each = not jobs.duplicated(["draft", factor]).any()  # else the band is a CI over the other factors
    for ax, metric, name in zip(axes, ("alpha", "speedup"), (r"$\alpha$", "speedup over AR"), strict=True):
        sns.lineplot(data=jobs, x=factor, y=metric, hue="draft", marker="o", palette=palette, ax=ax,
                     legend=metric == "speedup", errorbar=None if one_job_each else ("ci", 95))
        if one_job_each:  # each job's own 95% interval
            job_errorbars(ax, jobs.dropna(subset=[metric]), factor, metric, palette, label=False, fmt="none")
        ax.set(xlabel=label, ylabel=name)
    return fig


def distillation_curves(history: pd.DataFrame, hue: str = "objective", style: str | None = None) -> Figure:
    """Held-out alpha over training steps, a line per `hue` (and dash per `style`), averaged
    over the remaining factors."""
    fig, (ax,) = _figure()
    sns.lineplot(data=history, x="step", y="val/alpha", hue=hue, style=style, marker="o", errorbar=None, ax=ax,
                 palette="colorblind")
    ax.set(xlabel="training step", ylabel=r"held-out $\alpha$ = 1 - TVD")
    return fig


def headline_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per draft at its best measured K: alpha, tau, c, speedup (with its 95% interval), predicted speedup, optimal K.
    Picking the best of several K favours a lucky timing: read the interval, not the ranking, where they overlap."""
    rows = []
    for draft, group in jobs.groupby("draft"):
        best = group.loc[group["speedup"].idxmax()] if group["speedup"].notna().any() else group.iloc[0]
        a, c = best["alpha"], best["cost_ratio_c"]
        k = best["k_label"] if "k_label" in best else int(best["k"])  # a number, or auto / heuristic
        rows.append({"draft": draft, "K": k, "alpha": a, "tau": best["tau"], "c": c,
                     "speedup": best["speedup"], "speedup 95% CI": fmt_bounds(column_interval(best, "speedup")),
                     "predicted": best["predicted_speedup"],
                     "optimal K": optimal_k(a, c) if pd.notna(a) and pd.notna(c) else None})
    return pd.DataFrame(rows).sort_values("speedup", ascending=False, na_position="last")
