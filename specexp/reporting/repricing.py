"""A finished sweep re-priced on other hardware (what `python -m specexp.reprice` writes).

Every job's rounds (what its draft proposed and the rule accepted, round by round) are priced with
the cost model under another machine's profile next to the profile the job ran with: acceptance does
not depend on the hardware; T(n), the draft's step and the prompt pass do.
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specexp.core.metrics import arms  # noqa: E402
from specexp.costs import cost_model  # noqa: E402
from specexp.costs.hardware_profile import Profile  # noqa: E402
from specexp.output import markdown_table  # noqa: E402
from specexp.reporting import plots  # noqa: E402
from specexp.reporting.job_profiles import job_profile, profile_label  # noqa: E402
from specexp.study.summary import k_max_of  # noqa: E402


def reprice(jobs: pd.DataFrame, profile: Profile) -> pd.DataFrame:
    """One row per job: its measured speedup, the model's under its own profile and under ``profile``
    (None, with the reason, where ``profile`` has no entry for the job's draft)."""
    rows = []
    for job in jobs.itertuples():
        folder = Path(job.path)
        summary = json.loads((folder / "summary.json").read_text())
        draft = summary.get("draft_profile")
        row = {"job": job.job, "draft": job.draft, "k": job.k_label, "speedup": job.speedup,
               "predicted_own": summary.get("predicted_speedup"), "predicted": None, "note": ""}
        if not (folder / "batches.parquet").is_file():
            row["note"] = "ran before batches.parquet was kept: rerun it"
        elif draft not in profile.drafts:
            row["note"] = (f"the profile has no entry for this draft ({draft}); "
                           f"profile it there with the same draft config")
        else:
            rounds, batches = pd.read_parquet(folder / "rounds.parquet"), pd.read_parquet(folder / "batches.parquet")
            spec, ar = arms(rounds)
            row["predicted"] = cost_model.predict_run(spec, ar, batches, int(k_max_of(summary)), profile, draft)[
                "predicted_speedup"]
        rows.append(row)
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, label: str, own_label: str | None) -> plt.Figure:
    """Predicted speedup per job under the given profile against the run's own (identity line):
    where the other hardware helps a draft and where it hurts."""
    plots.paper_theme()
    fig, ax = plt.subplots(figsize=(plots.COLUMN_WIDTH_IN, 2.6), layout="constrained")
    priced = table.dropna(subset=["predicted", "predicted_own"])
    palette = plots.palette_of(priced)
    for draft, rows in priced.groupby("draft"):
        ax.scatter(rows["predicted_own"], rows["predicted"], color=palette[draft], s=18, label=draft, zorder=3)
        for _, row in rows.iterrows():
            ax.annotate(f"K={row['k']}", (row["predicted_own"], row["predicted"]), fontsize=5, xytext=(2, 2),
                        textcoords="offset points")
    low = min(priced[["predicted", "predicted_own"]].min().min(), 1.0) * 0.95 if len(priced) else 0.5
    high = max(priced[["predicted", "predicted_own"]].max().max(), 1.0) * 1.05 if len(priced) else 2.0
    ax.plot([low, high], [low, high], color="0.5", linewidth=0.8, linestyle="--")
    ax.set(xlabel=f"predicted speedup, as run ({own_label or 'its own profile'})", ylabel=f"predicted on {label}",
           xlim=(low, high), ylim=(low, high))
    ax.legend(fontsize=6)
    return fig


def write_repricing(table: pd.DataFrame, profile: Profile, jobs: pd.DataFrame, out: Path) -> None:
    """OUT/reprice.csv, reprice.md (the table under the profile's label) and reprice.pdf/png (the figure)."""
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "reprice.csv", index=False)
    label = profile_label(profile)
    own = job_profile(jobs["path"].iloc[0])
    (out / "reprice.md").write_text(f"Re-priced on {label}\n\n" + markdown_table(table))
    fig = figure(table, label, profile_label(own) if own else None)
    for suffix in ("pdf", "png"):
        fig.savefig(out / f"reprice.{suffix}")
