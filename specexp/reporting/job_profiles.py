"""What the figures say of the hardware profile a job was priced with: the profile kept in its folder, its
label in captions, the cost model's speedup curve over K, and the pass-cost ratios of the cost/quality plane."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from specexp.core import metrics
from specexp.costs import cost_model
from specexp.costs.hardware_profile import Profile


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
