"""The tables the paper figures and the analysis notebooks draw from: finished study jobs with short column
names (draft, k, temperature, batch_size, the metrics), each draft's label from its card, the pairing
prediction beside its jobs, one row per (job, prompt) and per (job, prompt, draft position), distillation
histories, and the same job table from W&B runs."""

from pathlib import Path

import numpy as np
import pandas as pd

from specexp.core import metrics
from specexp.costs import cost_model
from specexp.reporting.job_table import collect, validation_history
from specexp.study.summary import arm_metrics


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
