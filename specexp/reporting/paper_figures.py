"""The paper figures of a sweep (what `python -m specexp.figures` writes; the notebooks import it):
which figures the finished jobs support, each drawn by reporting/plots.py, and the headline table.

Reads study jobs (summary.json + rounds.parquet) and distillation runs (result.json + metrics.jsonl);
writes each figure as vector PDF and PNG and the headline numbers as markdown and LaTeX (booktabs).
"""

import json
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on clusters or in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specexp.core import metrics  # noqa: E402
from specexp.costs import cost_model  # noqa: E402
from specexp.costs.hardware_profile import Profile  # noqa: E402
from specexp.output import markdown_table  # noqa: E402
from specexp.reporting import plots  # noqa: E402
from specexp.reporting.job_table import collect, validation_history  # noqa: E402
from specexp.study.summary import arm_metrics  # noqa: E402


def study_jobs(paths: list[Path]) -> pd.DataFrame:
    """Finished study jobs with short column names: draft, k, temperature, batch_size, metrics."""
    return finished_studies(collect(paths))


def finished_studies(table: pd.DataFrame) -> pd.DataFrame:
    """`study_jobs` of a collected table (reporting/job_table.collect)."""
    if table.empty or "status" not in table or "alpha" not in table:
        return pd.DataFrame()
    table = table[(table["status"] == "ok") & (table["kind"] == "study")].copy()
    table["draft"] = draft_labels(table)
    table["draft_colour"] = table["cfg.draft.card.colour"] if "cfg.draft.card.colour" in table else None
    table["exit_layer"] = table["cfg.draft.exit_layer"] if "cfg.draft.exit_layer" in table else None
    table["k_label"] = table["cfg.draft.k"].astype(str)  # a number, or auto / heuristic
    table["k"] = pd.to_numeric(table["cfg.draft.k"], errors="coerce")  # NaN where a policy chose K
    table["temperature"] = table["cfg.sampling.temperature"].astype(float)
    table["target"] = table["choice.target"] if "choice.target" in table else table.get("target")  # the config's name
    table["data"] = table["choice.data"] if "choice.data" in table else None
    table["batch_size"] = table["cfg.batch_size"].astype(int)
    # children per expanded node (1: a chain; drafts without trees are chains)
    branches = table["cfg.draft.branches"] if "cfg.draft.branches" in table else pd.Series(1, index=table.index)
    table["branches"] = pd.to_numeric(branches, errors="coerce").fillna(1).astype(int)
    mean_k = table["mean_k"] if "mean_k" in table else table["k"]
    table["alpha_equivalent"] = [cost_model.equivalent_alpha(tau, k)
                                 if pd.notna(tau) and pd.notna(k) and k > 0 else None
                                 for tau, k in zip(table["tau"], mean_k.fillna(table["k"]), strict=True)]
    return table.reset_index(drop=True)


def with_pairing_predictions(jobs: pd.DataFrame, paths: list[Path]) -> pd.DataFrame:
    """The jobs with `pairing_predicted_speedup` (and _alpha) where a folder holds `python -m specexp.pairing
    --out FOLDER`'s pairing.parquet: each (target, draft, data, temperature) at its predicted best K."""
    found = [p / "pairing.parquet" for p in paths if (p / "pairing.parquet").is_file()]
    if jobs.empty or not found:
        return jobs
    predicted = pd.concat([pd.read_parquet(f) for f in found])
    best = predicted[predicted["is_best_k"]].rename(columns={"predicted_speedup": "pairing_predicted_speedup",
                                                             "predicted_alpha": "pairing_predicted_alpha"})
    keys = ["target", "draft", "data", "temperature"]
    jobs = (jobs.assign(draft_config=jobs["choice.draft"]) if "choice.draft" in jobs
            else jobs.assign(draft_config=jobs["draft"]))
    merged = jobs.merge(best[keys + ["pairing_predicted_speedup", "pairing_predicted_alpha"]].rename(
        columns={"draft": "draft_config"}), on=["target", "draft_config", "data", "temperature"], how="left")
    return merged.drop(columns="draft_config")


def job_profile(job_path: str | Path) -> Profile | None:
    """The hardware profile a job was priced with (its folder keeps a copy), if any."""
    path = Path(job_path) / "profile.json"
    return Profile.load(path) if path.is_file() else None


def profile_label(profile: Profile) -> str:
    """What a caption says of a profile: the processor (or GPU), its batch size and runtime."""
    device = profile.key.get("gpu") or profile.key.get("cpu", "unknown").split(" [")[0]
    return f"{device}, batch {profile.key.get('batch_size')}, runtime {profile.key.get('runtime', {}).get('name')}"


def model_curves(jobs: pd.DataFrame, profile: Profile | None = None) -> tuple[pd.DataFrame, str | None]:
    """The calibrated model's speedup at K = 1..K_max per draft: its run at the largest fixed K
    re-priced with its first K tokens a round kept (`cost_model.predict_run(limit=K)`), under its
    own profile (or ``profile``). Drafts whose runs kept no profile or rounds are left out."""
    rows, label = [], None
    for draft, group in jobs.dropna(subset=["k"]).groupby("draft"):
        reference = group.loc[group["k"].idxmax()]
        folder = Path(reference["path"])
        priced_with = profile or job_profile(folder)
        if priced_with is None or not (folder / "batches.parquet").is_file():
            continue
        rounds, batches = pd.read_parquet(folder / "rounds.parquet"), pd.read_parquet(folder / "batches.parquet")
        name = json.loads((folder / "summary.json").read_text()).get("draft_profile")  # the draft's entry
        if name not in priced_with.drafts:
            continue
        spec, ar = metrics.arms(rounds)
        for k in range(1, int(group["k"].max()) + 1):
            predicted = cost_model.predict_run(spec, ar, batches, int(reference["k"]), priced_with, name, limit=k)
            rows.append({"draft": draft, "k": k, "speedup": predicted["predicted_speedup"]})
        label = profile_label(priced_with)
    return pd.DataFrame(rows), label


def draft_labels(table: pd.DataFrame) -> pd.Series:
    """Each job's draft as its card names it (`card.label`, else the config's name), followed by the
    values of the config keys its card lists as `variants` (early_exit/HEAD/MODE: the head and the
    mode change what is measured); a value that is a path (a trained folder) reads `custom`."""
    names = table["choice.draft"] if "choice.draft" in table else table["draft"]
    labels = table["cfg.draft.card.label"].fillna(names) if "cfg.draft.card.label" in table else names.copy()
    variants = (table["cfg.draft.card.variants"] if "cfg.draft.card.variants" in table
                else pd.Series(None, index=table.index))

    def label(row_label: str, keys, row: pd.Series) -> str:
        if not isinstance(keys, list | tuple | np.ndarray) or len(keys) == 0:
            return str(row_label)
        values = [str(row.get(f"cfg.draft.{key}")) for key in keys]
        return "/".join([str(row_label), *("custom" if "/" in v or "\\" in v else v for v in values)])

    return pd.Series([label(lab, keys, row)
                      for lab, keys, (_, row) in zip(labels, variants, table.iterrows(), strict=True)],
                     index=table.index, dtype=object)


def wandb_jobs(project: str, group: str | None = None) -> pd.DataFrame:
    """The same job table from W&B runs (`logger=wandb`): summary metrics + the config's draft,
    K, temperature and batch size. Needs network access and `wandb login`."""
    import wandb

    rows = []
    for run in wandb.Api().runs(project, filters={"group": group} if group else None):
        config, summary = run.config, dict(run.summary)
        k = config["draft"]["k"]  # a number, or auto / heuristic
        rows.append({"draft": run.job_type, "k": int(k) if str(k).isdigit() else None, "k_label": str(k),
                     "branches": int(config["draft"].get("branches", 1)),
                     "temperature": float(config["sampling"]["temperature"]), "batch_size": int(config["batch_size"]),
                     **{k: v for k, v in summary.items() if isinstance(v, int | float) and not k.startswith("_")}})
    return pd.DataFrame(rows)


def per_prompt_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, prompt): its alpha, tau and decode-time speedup over AR (arm_metrics, timed by
    the sum of its rounds' draft, target and verify seconds: prefill excluded, and the rounds of a batch
    are shared by its rows)."""
    rows = []
    jobs = jobs.assign(draft_colour=jobs["draft_colour"] if "draft_colour" in jobs else None)
    for job in jobs.itertuples():
        rounds = pd.read_parquet(Path(job.path) / "rounds.parquet")
        rounds["total_s"] = rounds["draft_s"] + rounds["target_s"] + rounds["verify_s"]
        rounds["tokens"] = rounds["emitted"]
        for prompt_id, r in rounds.groupby("prompt_id"):
            measured = arm_metrics(r, r.groupby("mode", as_index=False)[["tokens", "total_s"]].sum())
            rows.append({"draft": job.draft, "draft_colour": job.draft_colour, "k": job.k,
                         "temperature": job.temperature, "batch_size": job.batch_size,
                         "prompt_id": prompt_id, "category": r["category"].iloc[0], "alpha": measured.alpha,
                         "tau": measured.tau, "speedup": measured.speedup})
    return pd.DataFrame(rows)


def acceptance_by_position(jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, prompt, draft position i): P(accept i | 1..i-1 accepted) on that prompt."""
    rows = []
    jobs = jobs.assign(draft_colour=jobs["draft_colour"] if "draft_colour" in jobs else None)
    for job in jobs.itertuples():
        rounds = pd.read_parquet(Path(job.path) / "rounds.parquet")
        spec, _ = metrics.arms(rounds)
        for prompt_id, r in spec.groupby("prompt_id"):
            curve = metrics.acceptance_curve(metrics.positions(r), r["accepted"].to_numpy(), int(job.k_max))
            rows += [{"draft": job.draft, "draft_colour": job.draft_colour, "k": job.k, "prompt_id": prompt_id,
                      "position": i + 1, "acceptance": a}
                     for i, a in enumerate(curve) if a is not None]
    return pd.DataFrame(rows)


def distillation_history(paths: list[Path]) -> pd.DataFrame:
    """One row per (distillation run, validation), with the run's overrides and results as columns."""
    return validations(collect(paths))


def validations(table: pd.DataFrame) -> pd.DataFrame:
    """`distillation_history` of a collected table."""
    runs = table[table["kind"] == "distill"] if "kind" in table else table.iloc[:0]
    frames = []
    for run in runs.to_dict("records"):
        history = pd.DataFrame(validation_history(Path(run["path"])))
        if not history.empty:
            settings = {k.removeprefix("set."): v for k, v in run.items() if k.startswith("set.") and v == v}
            frames.append(history.assign(**settings, best_alpha=run["best_alpha"], run=run["path"]))
    history = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not history.empty and "objective" not in history:
        history["objective"] = "default"
    return history


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


def plane_pricing(jobs: pd.DataFrame, k_max: int = 16) -> tuple:
    """T(n)/T(1) for n = 1..k_max+1, the bookkeeping in AR passes, and the label of the first job's
    profile (at the median context its rounds ran at); nothing without one (Leviathan's plane)."""
    for path in jobs["path"]:
        profile = job_profile(path)
        if profile is not None:
            context = float(pd.read_parquet(Path(path) / "rounds.parquet")["context"].median())
            passes = profile.pass_s(np.arange(1, k_max + 2), context)
            return passes / passes[0], profile.overhead_s / passes[0], profile_label(profile)
    return None, 0.0, None


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
