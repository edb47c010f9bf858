"""Intervals for a study's headline numbers that hold their level at the sizes studies have (4-32
batches, 8-80 prompts).

Every headline number is a ratio of sums over units: alpha = accepted / looked at, tau = committed
/ rounds, the acceptance at position i = accepted / reached, summed over prompts; the speedup =
(spec tokens / spec seconds) / (AR tokens / AR seconds), summed over batches and their timings.
Its variance comes from the linearization of the ratio over units (the delta method; for a ratio
this is the jackknife's variance to first order), and the interval is a t interval with one degree
of freedom fewer than units, on a scale where the ratio is close to normal:

- the speedup and tau: on the log scale, back-transformed;
- alpha and the acceptance per position (proportions that reach 0 and 1): Korn and Graubard's
  (1998) Clopper-Pearson interval at the effective sample size the variance implies, its degrees of
  freedom adjusted to the units' (a standard for proportions over clustered samples).

A percentile bootstrap over 4-8 units covers 76-88% (the issue's synthetic studies); these cover
94-95% at 2 to 32 batches (tests/study/test_intervals.py). Below MIN_UNITS units a number gets no
interval, and `interval_notes` says why, never a zero-width one.

The speedup's timing passes may stop at a target half-width (specexp.study.timing): the passes
after the first `timing.repeats` are planned from those pilot passes alone (Stein's two-stage
design), and the interval of all passes then takes its variance from the pilot, so that stopping
where the half-width looked narrow does not narrow the interval's coverage.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from specexp.core import metrics
from specexp.core.metrics import position_counts

CONFIDENCE = 0.95
RESAMPLES = 2000  # bootstrap resamples, for the interval functions that still resample (benchmarks' pairs)
# Batches (speedup) or prompts (acceptance) below which a number gets no interval: one unit shows no
# spread at all; at two the t interval (1 dof, t = 12.7) is wide but still covers (0.949 in simulation).
MIN_UNITS = 2


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


@functools.lru_cache(maxsize=4096)
def t_quantile(dof: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``dof`` degrees of freedom."""
    return float(stats.t.ppf(0.5 + confidence / 2, dof))


def too_few(units: int, what: str) -> str | None:
    """Why a number over ``units`` units gets no interval (None: it gets one)."""
    return f"{what}: {units}, fewer than {MIN_UNITS}" if units < MIN_UNITS else None


def ratio_variance(numerators: np.ndarray, denominators: np.ndarray) -> tuple[float, float]:
    """R = sum(num) / sum(den) over n units [n] and the linearization variance of R (the jackknife's to
    first order): n / (n - 1) * sum(((num - R den) / sum(den))^2)."""
    n, total = len(numerators), denominators.sum()
    ratio = numerators.sum() / total
    influence = (numerators - ratio * denominators) / total  # [n], sums to 0
    return float(ratio), float(n / (n - 1) * (influence**2).sum())


def log_t_interval(numerators: np.ndarray, denominators: np.ndarray, confidence: float = CONFIDENCE) -> list[float]:
    """A t interval (n - 1 dof) for a positive ratio of sums over n units, on the log scale."""
    ratio, variance = ratio_variance(numerators, denominators)
    half = t_quantile(len(numerators) - 1, confidence) * math.sqrt(variance) / ratio  # sd of log R: sd(R) / R
    return [ratio * math.exp(-half), ratio * math.exp(half)]


def proportion_interval(successes: np.ndarray, trials: np.ndarray, confidence: float = CONFIDENCE) -> list[float]:
    """Korn and Graubard's interval for a proportion of sums over n units [n] (successes <= trials):
    Clopper-Pearson at the effective sample size p(1-p) / var(p), at most the trials in all (and all
    of them where p is 0 or 1, which says nothing of the spread), scaled by (z / t_{n-1})^2 so that
    few units widen it as a t interval would."""
    p, variance = ratio_variance(successes, trials)
    n_all = float(trials.sum())
    n_eff = min(p * (1 - p) / variance, n_all) if variance > 0 and 0 < p < 1 else n_all
    n_eff *= (stats.norm.ppf(0.5 + confidence / 2) / t_quantile(len(trials) - 1, confidence)) ** 2
    x, tail = p * n_eff, (1 - confidence) / 2
    lo = float(stats.beta.ppf(tail, x, n_eff - x + 1)) if x > 0 else 0.0
    hi = float(stats.beta.ppf(1 - tail, x + 1, n_eff - x)) if x < n_eff else 1.0
    return [lo, hi]


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


def over_units(numerators: np.ndarray, denominators: np.ndarray, interval, what: str = "prompts",
               confidence: float = CONFIDENCE) -> tuple[list[float] | None, str | None]:
    """``interval`` of sum(num) / sum(den) over the units whose denominator is not 0, or None and why
    (fewer than MIN_UNITS such units; nothing to count)."""
    keep = denominators > 0
    if not keep.any():
        return None, None  # no ratio at all (alpha of a run that never drafted): nothing to explain
    if (why := too_few(int(keep.sum()), what)) is not None:
        return None, why
    return interval(numerators[keep], denominators[keep], confidence), None


def acceptance_intervals(spec_rounds: pd.DataFrame, k: int, rng: np.random.Generator | None = None,
                         resamples: int = RESAMPLES, confidence: float = CONFIDENCE) -> dict:
    """alpha_ci95, tau_ci95 ([lo, hi] or None) and acceptance_curve_ci95 (one per position) over
    prompts, and `interval_notes`: why each None is None. (``rng`` and ``resamples`` are unused, the
    intervals are analytic; kept for callers.)"""
    sums = prompt_sums(spec_rounds, k)
    alpha, alpha_why = over_units(sums["accepted"], sums["looked_at"], proportion_interval)
    tau, tau_why = over_units(sums["emitted"], sums["rounds"], log_t_interval)
    if not sums["looked_at"].any():  # nothing drafted: every round commits one token, tau is 1 by construction
        tau, tau_why = None, "no draft tokens: tau is 1 by construction"
    curve = [over_units(sums["position_accepted"][:, i], sums["position_reached"][:, i], proportion_interval)
             for i in range(k)]
    notes = {"alpha": alpha_why, "tau": tau_why} | {f"acceptance_curve[{i + 1}]": why
                                                    for i, (_, why) in enumerate(curve)}
    return {"alpha_ci95": alpha, "tau_ci95": tau, "acceptance_curve_ci95": [ci for ci, _ in curve],
            "interval_notes": {key: why for key, why in notes.items() if why is not None}}


PAIRED_COLUMNS = ["batch", "repeat", "tokens_spec", "total_s_spec", "tokens_ar", "total_s_ar"]
TIMED = ["tokens_spec", "total_s_spec", "tokens_ar", "total_s_ar"]


def paired_timings(batches: pd.DataFrame) -> pd.DataFrame:
    """One row per (batch, repeat) with both arms' tokens and seconds side by side (and which arm ran
    first, and whether the timing was a pilot one, where recorded), from a table with one row per
    (mode, batch, repeat) (batches.parquet; tables written before repeats have one timing per batch)."""
    keys = ["batch", "repeat"] if "repeat" in batches else ["batch"]
    extra = [column for column in ("first", "pilot") if column in batches]
    if batches.empty:
        return pd.DataFrame(columns=PAIRED_COLUMNS)
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


@dataclass(frozen=True)
class SpeedupSpread:
    """How the log speedup varies, from timings of B batches, n each: ``batch_means`` = s_B^2, the
    variance between batches of a batch's mean influence on log S (the log speedup's variance is
    s_B^2 / B), and ``within`` = s_w^2, one timing's variance about its batch's mean (None with one
    timing per batch, or batches timed unequally often)."""

    batches: int
    timings: int
    batch_means: float
    within: float | None

    @property
    def between(self) -> float | None:
        """s_B^2 - s_w^2 / n: the part of s_B^2 no number of timings averages away (0 where noise is all of it)."""
        return None if self.within is None else max(self.batch_means - self.within / self.timings, 0.0)

    def variance(self, timings: int) -> tuple[float, float]:
        """The variance of log S and its degrees of freedom once every batch is timed ``timings`` times:
        s_B^2 / B (B - 1 dof) at the spread's own count; else between / B + s_w^2 / (timings B), with
        Satterthwaite's degrees of freedom (Stein's two-stage design: the spread is the pilot's)."""
        B, n = self.batches, self.timings
        if timings == n or self.within is None:
            return self.batch_means / B, B - 1.0
        if self.batch_means <= self.within / n:  # the batches' spread is all timing noise
            return self.within / (timings * B), B * (n - 1.0)
        a, c = self.batch_means / B, (1 / timings - 1 / n) * self.within / B  # v = a + c
        dof = (a + c) ** 2 / (a**2 / (B - 1) + c**2 / (B * (n - 1)))
        return a + c, max(dof, 1.0)


def speedup_spread(paired: pd.DataFrame) -> SpeedupSpread:
    """The spread of ``paired``'s timings (>= 2 batches)."""
    codes, _ = pd.factorize(paired["batch"])
    return spread_of(paired[TIMED].to_numpy(dtype=float), codes)


def spread_of(timed: np.ndarray, codes: np.ndarray) -> SpeedupSpread:
    """The spread of timings [N, 4] (TIMED's columns) of batches ``codes`` [N] (0..B-1): each timing's
    influence on log S, the linearization of log(sum T_spec) - log(sum s_spec) - log(sum T_ar) + log(sum s_ar)."""
    B = int(codes.max()) + 1
    influence = timed @ (np.array([1.0, -1.0, -1.0, 1.0]) / timed.sum(0))  # [N]: sums to 0
    means = B * np.bincount(codes, influence, B)  # z_b [B]: B x a batch's summed influence
    batch_means = float((means**2).sum() / (B - 1))
    counts = np.bincount(codes, minlength=B)
    n = int(counts[0]) if (counts == counts[0]).all() else 0
    if n < 2:
        return SpeedupSpread(B, max(n, 1), batch_means, None)
    y = influence * B * n  # y_bj, whose mean over a batch's timings is z_b
    within = float(((y - means[codes]) ** 2).sum() / (B * (n - 1)))
    return SpeedupSpread(B, n, batch_means, within)


def halfwidth_at(spread: SpeedupSpread, speedup: float, timings: int, confidence: float = CONFIDENCE) -> float:
    """The speedup interval's half-width (speedup units) once every batch is timed ``timings`` times."""
    variance, dof = spread.variance(timings)
    return speedup * math.sinh(t_quantile(dof, confidence) * math.sqrt(variance))


def speedup_interval(paired: pd.DataFrame, rng: np.random.Generator | None = None, resamples: int = RESAMPLES,
                     confidence: float = CONFIDENCE) -> dict:
    """The speedup's interval over batches and their timings (``speedup_ci95``): a t interval on log S
    with the linearization variance over batches. Where a `pilot` column marks the timings later
    passes were planned from, the variance is the pilot's (specexp.study.timing). Also what more
    timing could still narrow: the half-width of the timing noise alone, and the half-width left with
    noise-free timings (the spread between batches: more prompts narrow it, repeats do not), and
    `speedup_note`, why there is no interval. (``rng``, ``resamples``: unused; kept for callers.)"""
    none = {"speedup_ci95": None, "speedup_halfwidth": None, "noise_halfwidth": None, "between_batch_halfwidth": None}
    timed = paired[TIMED].to_numpy(dtype=float)  # [N, 4]
    spec_tokens, spec_s, ar_tokens, ar_s = timed.sum(0)
    if not len(timed) or not spec_s or not ar_s or not ar_tokens:
        return none | {"speedup_note": "no timings"}
    speedup = float((spec_tokens / spec_s) / (ar_tokens / ar_s))
    codes, _ = pd.factorize(paired["batch"])
    if (why := too_few(int(codes.max()) + 1, "batches")) is not None:
        return none | {"speedup_note": why}
    pilot = paired["pilot"].to_numpy(dtype=bool) if "pilot" in paired else np.ones(len(timed), dtype=bool)
    spread = spread_of(timed[pilot], codes[pilot]) if not pilot.all() else spread_of(timed, codes)
    timings = int(np.bincount(codes).max())
    variance, dof = spread.variance(timings)
    half_log = t_quantile(dof, confidence) * math.sqrt(variance)
    t = t_quantile(spread.batches - 1, confidence)
    return {"speedup_ci95": [speedup * math.exp(-half_log), speedup * math.exp(half_log)],
            "speedup_halfwidth": speedup * math.sinh(half_log),
            "noise_halfwidth": None if spread.within is None else
            speedup * math.sinh(t * math.sqrt(spread.within / (timings * spread.batches))),
            "between_batch_halfwidth": None if spread.between is None else
            speedup * math.sinh(t * math.sqrt(spread.between / spread.batches)),
            "speedup_dof": dof, "speedup_note": None}


def column_interval(row: pd.Series, metric: str) -> list[float] | None:
    """A job table row's 95% interval of a metric, from its `METRIC_ci95_lo` / `_hi` columns (None without one)."""
    lo, hi = row.get(f"{metric}_ci95_lo"), row.get(f"{metric}_ci95_hi")
    return [lo, hi] if pd.notna(lo) and pd.notna(hi) else None


def fmt_bounds(interval: list[float] | None, digits: int = 3) -> str:
    """'[1.050, 1.190]'; '-' without an interval."""
    return "-" if interval is None else f"[{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def fmt_interval(value: float | None, interval: list[float] | None, digits: int = 3, note: str | None = None) -> str:
    """'1.120 [1.050, 1.190]'; without an interval the value alone, or with why there is none
    ('1.120 (no interval: 2 batches < 3)'); '-' without a value."""
    if value is None:
        return "-"
    if interval is None:
        return f"{value:.{digits}f}" + (f" (no interval: {note})" if note else "")
    return f"{value:.{digits}f} {fmt_bounds(interval, digits)}"
