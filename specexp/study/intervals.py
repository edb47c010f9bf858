"""Bootstrap intervals for a study's headline numbers.

alpha, tau and the acceptance per position are ratios of sums over prompts (accepted / looked at,
committed / rounds), so resampling prompts with replacement gives their spread over prompt sets
like this one. The speedup is a ratio of two arms' tokens per second, timed interleaved on the
same batches: resampling batches, each with both arms' timings (every repeat) kept together,
gives its spread over prompts and timing noise together (a paired bootstrap); resampling each
batch's repeated timings with the batches held fixed gives the timing noise alone. Intervals are
percentile intervals; every function takes an explicit numpy Generator, so a study's intervals
are reproducible from its seed.
"""

import numpy as np
import pandas as pd

from specexp.core import metrics
from specexp.core.metrics import position_counts

CONFIDENCE = 0.95
RESAMPLES = 2000


def percentile_interval(samples: np.ndarray, confidence: float = CONFIDENCE) -> list[float] | None:
    """The central ``confidence`` interval of bootstrap samples [R] ([lo, hi]); None if none is finite."""
    samples = samples[np.isfinite(samples)]
    if not len(samples):
        return None
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return [float(lo), float(hi)]


def resample_counts(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """How often each of n units is drawn in each of ``resamples`` draws of n with replacement [R, n]."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)


def ratio_samples(numerators: np.ndarray, denominators: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """sum(num) / sum(den) per resample: numerators, denominators [n] or [n, M], counts [R, n] -> [R] or [R, M]."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (counts @ numerators) / (counts @ denominators)


def prompt_sums(spec_rounds: pd.DataFrame, k: int) -> dict[str, np.ndarray]:
    """Per prompt of the speculative arm's rounds (one row per prompt and round): the sums alpha, tau
    and the acceptance per position are ratios of: accepted, looked_at, emitted, rounds [P] and, per
    draft position 1..k, reached and accepted [P, k]."""
    depth = (spec_rounds["depth"] if "depth" in spec_rounds else spec_rounds["proposed"]).to_numpy()
    accepted = spec_rounds["accepted"].to_numpy()
    codes, _ = pd.factorize(spec_rounds["prompt_id"])
    P = codes.max() + 1 if len(codes) else 0
    looked_at = metrics.looked_at(depth, accepted)
    reached, took = position_counts(depth, accepted, None, k)  # [N, k] each

    def per_prompt(values: np.ndarray) -> np.ndarray:
        out = np.zeros((P,) + values.shape[1:])
        np.add.at(out, codes, values)
        return out

    return {"accepted": per_prompt(accepted.astype(float)), "looked_at": per_prompt(looked_at.astype(float)),
            "emitted": per_prompt(spec_rounds["emitted"].to_numpy().astype(float)),
            "rounds": per_prompt(np.ones(len(depth))),
            "position_reached": per_prompt(reached.astype(float)), "position_accepted": per_prompt(took.astype(float))}


def acceptance_intervals(spec_rounds: pd.DataFrame, k: int, rng: np.random.Generator, resamples: int = RESAMPLES,
                         confidence: float = CONFIDENCE) -> dict:
    """alpha_ci95, tau_ci95 ([lo, hi] or None) and acceptance_curve_ci95 (one per position) by a
    bootstrap over prompts."""
    sums = prompt_sums(spec_rounds, k)
    n_prompts = len(sums["rounds"])
    if n_prompts == 0:
        return {"alpha_ci95": None, "tau_ci95": None, "acceptance_curve_ci95": [None] * k}
    counts = resample_counts(n_prompts, resamples, rng)  # [R, P]
    alpha = ratio_samples(sums["accepted"], sums["looked_at"], counts)
    tau = ratio_samples(sums["emitted"], sums["rounds"], counts)
    curve = ratio_samples(sums["position_accepted"], sums["position_reached"], counts)  # [R, k]
    reached = sums["position_reached"].sum(0)
    return {"alpha_ci95": percentile_interval(alpha, confidence) if sums["looked_at"].sum() else None,
            "tau_ci95": percentile_interval(tau, confidence),
            "acceptance_curve_ci95": [percentile_interval(curve[:, i], confidence) if reached[i] else None
                                      for i in range(k)]}


def paired_timings(batches: pd.DataFrame) -> pd.DataFrame:
    """One row per (batch, repeat) with both arms' tokens and seconds side by side (and which arm ran
    first, where recorded), from a table with one row per (mode, batch, repeat) (batches.parquet;
    tables written before repeats have one timing per batch)."""
    keys = ["batch", "repeat"] if "repeat" in batches else ["batch"]
    extra = ["first"] if "first" in batches else []
    if batches.empty:
        return pd.DataFrame(columns=["batch", "repeat", "tokens_spec", "total_s_spec", "tokens_ar", "total_s_ar"])
    arms = {mode: rows.set_index(keys) for mode, rows in batches.groupby("mode")}
    paired = arms["spec"][["tokens", "total_s"] + extra].join(arms["ar"][["tokens", "total_s"]], lsuffix="_spec",
                                                                rsuffix="_ar", how="inner").reset_index()
    return paired if "repeat" in paired else paired.assign(repeat=0)


def paired_speedup(paired: pd.DataFrame) -> float | None:
    """The speedup of the timings given: spec tokens/s over AR tokens/s, sums over them all."""
    spec_s, ar_s = paired["total_s_spec"].sum(), paired["total_s_ar"].sum()
    if not spec_s or not ar_s or not paired["tokens_ar"].sum():
        return None
    return float((paired["tokens_spec"].sum() / spec_s) / (paired["tokens_ar"].sum() / ar_s))


def speedup_samples(paired: pd.DataFrame, rng: np.random.Generator, resamples: int = RESAMPLES,
                    over: str = "batches") -> np.ndarray:
    """Bootstrap samples of the speedup (spec tokens/s over AR tokens/s, sums over every timing) [R].

    over="batches": batches drawn with replacement, each with all its timings (both arms' timings of
    a batch stay paired); the timing noise is already in each batch's totals, so drawing its
    repeats as well would count it twice (checked: ~99% coverage of a nominal 95%).
    over="repeats": the batches held fixed, each batch's repeated timings drawn with replacement:
    the timing noise alone, the part more repeats narrow.
    """
    quantities = ["tokens_spec", "total_s_spec", "tokens_ar", "total_s_ar"]
    groups = [rows[quantities].to_numpy() for _, rows in paired.groupby("batch")]  # [n_b, 4] per batch
    B, N = len(groups), max(len(rows) for rows in groups)
    table = np.zeros((B, N, 4))  # repeats past a batch's own count stay zero
    n_repeats = np.array([len(rows) for rows in groups])  # [B]
    for b, rows in enumerate(groups):
        table[b, : len(rows)] = rows
    if over == "batches":
        totals = resample_counts(B, resamples, rng) @ table.sum(1)  # [R, 4]
    elif over == "repeats":
        picks = (rng.random((resamples, B, N)) * n_repeats[None, :, None]).astype(int)  # [R, B, N] indices < n_b
        used = (np.arange(N)[None, :] < n_repeats[:, None])[None, :, :, None]  # [1, B, N, 1]
        drawn = table[np.arange(B)[None, :, None], picks] * used  # [R, B, N, 4]
        totals = drawn.sum((1, 2))  # [R, 4]
    else:
        raise ValueError(f"over={over!r}: batches or repeats")
    spec_tokens, spec_s, ar_tokens, ar_s = totals.T
    with np.errstate(invalid="ignore", divide="ignore"):
        return (spec_tokens / spec_s) / (ar_tokens / ar_s)


def speedup_interval(paired: pd.DataFrame, rng: np.random.Generator, resamples: int = RESAMPLES,
                     confidence: float = CONFIDENCE) -> dict:
    """The speedup's interval over batches and repeats (``speedup_ci95``), and what more timing could
    still narrow: the half-width of the timing noise alone (batches held fixed) and the half-width
    left with noise-free timings (the spread between batches: more prompts narrow it, repeats do not)."""
    if paired.empty:
        return {"speedup_ci95": None, "speedup_halfwidth": None, "noise_halfwidth": None, "between_batch_halfwidth": None}
    both = percentile_interval(speedup_samples(paired, rng, resamples), confidence)
    repeated = paired.groupby("batch").size().max() > 1  # one timing per batch says nothing of the noise alone
    noise = percentile_interval(speedup_samples(paired, rng, resamples, over="repeats"), confidence) if repeated else None
    halfwidth = (both[1] - both[0]) / 2 if both else None
    noise_halfwidth = (noise[1] - noise[0]) / 2 if noise else None
    between = float(np.sqrt(max(halfwidth**2 - noise_halfwidth**2, 0.0))) if both and noise else None
    return {"speedup_ci95": both, "speedup_halfwidth": halfwidth, "noise_halfwidth": noise_halfwidth,
            "between_batch_halfwidth": between}


INTERVAL_METRICS = ("alpha", "tau", "speedup")  # the headline numbers summary.json gives a METRIC_ci95: [lo, hi]


def interval_columns(summary: dict) -> dict:
    """A summary's headline intervals as scalar columns `METRIC_ci95_lo`, `_hi` (None where it has none)."""
    columns = {}
    for metric in INTERVAL_METRICS:
        columns[f"{metric}_ci95_lo"], columns[f"{metric}_ci95_hi"] = summary.get(f"{metric}_ci95") or (None, None)
    return columns


def column_interval(row: pd.Series, metric: str) -> list[float] | None:
    """A job table row's 95% interval of a metric, from its `METRIC_ci95_lo` / `_hi` columns (None without one)."""
    lo, hi = row.get(f"{metric}_ci95_lo"), row.get(f"{metric}_ci95_hi")
    return [lo, hi] if pd.notna(lo) and pd.notna(hi) else None


def fmt_bounds(interval: list[float] | None, digits: int = 3) -> str:
    """'[1.050, 1.190]'; '-' without an interval."""
    return "-" if interval is None else f"[{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def fmt_interval(value: float | None, interval: list[float] | None, digits: int = 3) -> str:
    """'1.120 [1.050, 1.190]'; the value alone without an interval, '-' without a value."""
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if interval is None else f"{value:.{digits}f} {fmt_bounds(interval, digits)}"
