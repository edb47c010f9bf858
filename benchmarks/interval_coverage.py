"""How often the study's 95% intervals hold the truth, on the synthetic studies tests/study/test_intervals.py
draws (issue 49): the record of the figures the README and the issue quote.

  python benchmarks/interval_coverage.py [--studies 2000] [--out benchmarks/interval_coverage.md]

1. The speedup (specexp.study.intervals.speedup_interval) over heterogeneous batches (per-batch
   speedup lognormal sd 0.2 in log, AR seconds sd 0.3, timing noise sd 0.05, two timings a batch) at
   2-32 batches, beside the percentile bootstrap over batches it replaced.
2. alpha and tau over heterogeneous prompts (each prompt's acceptance Beta(6, 4), its positions
   Poisson(8..60)) at 4-32 prompts.
3. The timing plan (specexp.study.timing): timing noise dominating (sd 0.15 a timing, batches' speedups
   sd 0.03), the passes planned from one pilot pass to a target half-width, against stopping the first
   time the interval looked that narrow.
Each coverage with its binomial 95% interval (Clopper-Pearson) over the simulated studies.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from common import report_header, write_report
from scipy import stats

sys.path.insert(0, str(Path(__file__).parents[1]))  # the tests' simulators
from specexp.study import intervals, timing  # noqa: E402
from specexp.study.timing import TimingSettings  # noqa: E402
from tests.study.test_intervals import heterogeneous_study, percentile_bootstrap, two_stage_study  # noqa: E402


def coverage(hits: int, n: int) -> str:
    """'0.947 [0.937, 0.956] (n = 2000)': the share and its Clopper-Pearson 95% interval."""
    lo = stats.beta.ppf(0.025, hits, n - hits + 1) if hits else 0.0
    hi = stats.beta.ppf(0.975, hits + 1, n - hits) if hits < n else 1.0
    return f"{hits / n:.3f} [{lo:.3f}, {hi:.3f}] (n = {n})"


def speedup_rows(studies: int) -> list[str]:
    rows = ["| batches | t interval on log S | percentile bootstrap (replaced) |", "|---|---|---|"]
    for batches in (2, 4, 8, 16, 32):
        rng = np.random.default_rng(batches)
        hits = old = old_n = 0
        for study in range(studies):
            paired, truth = heterogeneous_study(rng, batches, timings=2)
            lo, hi = intervals.speedup_interval(paired)["speedup_ci95"]
            hits += lo <= truth <= hi
            if study < studies // 4:  # the bootstrap resamples: a quarter of the studies is enough to see it
                lo, hi = percentile_bootstrap(paired, rng)
                old, old_n = old + (lo <= truth <= hi), old_n + 1
        rows.append(f"| {batches} | {coverage(hits, studies)} | {coverage(old, old_n)} |")
    return rows


def acceptance_rows(studies: int) -> list[str]:
    rows = ["| prompts | alpha | tau |", "|---|---|---|"]
    for units in (4, 8, 16, 32):
        rng = np.random.default_rng(100 + units)
        alpha_hits = tau_hits = 0
        for _ in range(studies):
            looked = rng.poisson(rng.uniform(8, 60, units)).astype(float) + 1  # [P]
            accepted = rng.binomial(looked.astype(int), rng.beta(6, 4, units)).astype(float)
            lo, hi = intervals.proportion_interval(accepted, looked)
            alpha_hits += lo <= 0.6 <= hi
            lo, hi = intervals.log_t_interval(looked + accepted, looked)  # tau: committed / rounds
            tau_hits += lo <= 1.6 <= hi
        rows.append(f"| {units} | {coverage(alpha_hits, studies)} | {coverage(tau_hits, studies)} |")
    return rows


def naive_stop(rng: np.random.Generator, settings: TimingSettings, batches: int) -> tuple[bool, int]:
    """Stop after the first pass whose interval is within the target half-width (or at max_repeats)."""
    per_pass = timing.TIMINGS_PER_PASS
    paired, truth = heterogeneous_study(rng, batches, per_pass * settings.max_repeats, speedup_sd=0.03, noise=0.15)
    for passes in range(1, settings.max_repeats + 1):
        got = intervals.speedup_interval(paired[paired["repeat"] < per_pass * passes])
        if got["speedup_halfwidth"] <= settings.target_halfwidth:
            break
    lo, hi = got["speedup_ci95"]
    return lo <= truth <= hi, passes


def plan_rows(studies: int) -> list[str]:
    rows = ["| batches | target half-width | two-stage plan | mean passes | stop when narrow | mean passes |",
            "|---|---|---|---|---|---|"]
    for batches, target in ((8, 0.06), (16, 0.04)):
        settings = TimingSettings(repeats=1, target_halfwidth=target, max_repeats=8, budget_s=1e9)
        rng = np.random.default_rng(batches)
        planned = [two_stage_study(rng, settings, batches, speedup_sd=0.03, noise=0.15) for _ in range(studies)]
        hits = sum(ci["speedup_ci95"][0] <= truth <= ci["speedup_ci95"][1] for ci, truth, _ in planned)
        naive = [naive_stop(np.random.default_rng(10_000 * batches + s), settings, batches) for s in range(studies)]
        rows.append(f"| {batches} | {target} | {coverage(hits, studies)} | {np.mean([p for *_, p in planned]):.2f} | "
                    f"{coverage(sum(h for h, _ in naive), studies)} | {np.mean([p for _, p in naive]):.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", type=int, default=2000, help="simulated studies per cell (the plan's: a half)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "interval_coverage.md")
    args = parser.parse_args()
    lines = report_header("Coverage of the study's 95% intervals on synthetic studies")
    lines += ["Share of simulated studies whose 95% interval held the true value, with its binomial 95%",
              "interval (the designs of tests/study/test_intervals.py, which bound these shares).", "",
              "## Speedup over heterogeneous batches", "", *speedup_rows(args.studies), "",
              "## alpha and tau over heterogeneous prompts", "", *acceptance_rows(args.studies), "",
              "## The timing plan against stopping when the interval looks narrow", "",
              *plan_rows(args.studies // 2)]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
