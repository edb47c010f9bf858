"""Intervals on every headline number (specexp.study.intervals), the timing passes that narrow the
speedup's (specexp.study.timing), and the A/A control (draft=none) they are checked on.

Coverage tests repeat a whole measurement over seeds and count how often its 95% interval holds
the truth. Each states its false-failure probability for a correct build; the seeds are fixed,
so a given build passes or fails deterministically.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import Prompt
from specexp.drafts.none import NoDrafter
from specexp.drafts.oracle import OracleDrafter
from specexp.study import intervals, timing
from specexp.study.references import greedy_continuations
from specexp.study.results import JobResults
from specexp.study.run import Study, round_table, run_study
from specexp.study.timing import TimingSettings
from specexp.study.tracking import NullTracker
from tests.commands import REPO
from tests.conftest import tiny_model

NO_EOS = [10**6]


def binomial_tail_below(n: int, p: float, k: int) -> float:
    """P(X < k) for X ~ Binomial(n, p)."""
    return float(stats.binom.cdf(k - 1, n, p))


def test_the_alpha_interval_covers_the_oracles_alpha_at_about_95_percent():
    """draft=oracle accepts each position it reaches with probability alpha = 0.6 (greedy), so the
    truth is known. 60 seeds (which tokens the oracle spoils) of 16 prompts x 30 tokens at K = 3:
    the bootstrap interval over prompts must hold 0.6 at least 48 times. If its true coverage is
    0.92 (a percentile bootstrap over 16 prompts runs a little under 95%), P(fewer than 48) < 1e-3
    (below); an interval that missed the point or ignored the spread would cover far less, and
    its mean width is bounded too (one that held everything would be useless)."""
    target = tiny_model(3, layers=1)
    prompts = [[5 + i, 6, 7, 8 + i % 5] for i in range(16)]
    reference = greedy_continuations(target.model, target, prompts, 30, len(prompts))
    records = [Prompt(id=str(i), text="", category=None) for i in range(len(prompts))]
    hits, widths = 0, []
    for seed in range(60):
        drafter = OracleDrafter(target, alpha=0.6, k=3, cost_layers=0, seed=seed)
        drafter.set_reference(prompts, reference)
        out = generate(target.model, prompts, drafter, SamplingConfig(), 30, NO_EOS, None)
        spec = round_table(out, records, "spec", 0, 3)
        ci = intervals.acceptance_intervals(spec, 3, np.random.default_rng(seed), resamples=400)["alpha_ci95"]
        hits += ci[0] <= 0.6 <= ci[1]
        widths.append(ci[1] - ci[0])
    assert binomial_tail_below(60, 0.92, 48) < 1e-3
    assert hits >= 48, f"the alpha interval held 0.6 in {hits} of 60 seeds"
    looked_at = 16 * 29 * (1 + 0.6 + 0.36) / (1 + 0.6 + 0.36 + 0.216)  # ~ positions the rule looks at per seed
    assert np.mean(widths) < 2 * 2 * 1.96 * math.sqrt(0.6 * 0.4 / looked_at)  # not wide enough to hold anything


def synthetic_timings(rng: np.random.Generator, ratio: float, batches: int = 8, repeats: int = 3,
                      noise: float = 0.1) -> pd.DataFrame:
    """batches.parquet's paired view for two arms whose true speedup is ``ratio``: batch lengths
    differ, each timing carries lognormal noise, both arms emit the same tokens."""
    rows = []
    for b in range(batches):
        base = rng.uniform(2.0, 6.0)  # AR seconds of this batch
        for r in range(repeats):
            rows.append({"batch": b, "repeat": r, "tokens_spec": 64, "tokens_ar": 64,
                         "total_s_ar": base * rng.lognormal(0, noise),
                         "total_s_spec": base / ratio * rng.lognormal(0, noise)})
    return pd.DataFrame(rows)


def heterogeneous_study(rng: np.random.Generator, batches: int, timings: int, speedup_sd: float = 0.2,
                        noise: float = 0.05, median_speedup: float = 1.1) -> tuple[pd.DataFrame, float]:
    """A study whose batches differ as real ones do: each batch's speedup lognormal (sd ``speedup_sd``
    in log), its AR seconds lognormal (sd 0.3), each timing's noise lognormal (sd ``noise``), every
    batch timed ``timings`` times; and the true speedup, the ratio of sums over the batches' population:
    E[AR s] / E[spec s] = 1 / E[1 / r] = median * exp(-sd^2 / 2)."""
    ar = np.exp(rng.normal(np.log(3.0), 0.3, batches))[:, None]  # [B, 1]
    speedup = np.exp(rng.normal(np.log(median_speedup), speedup_sd, batches))[:, None]
    total_s_ar = ar * np.exp(rng.normal(0, noise, (batches, timings)))  # [B, n]
    total_s_spec = ar / speedup * np.exp(rng.normal(0, noise, (batches, timings)))
    paired = pd.DataFrame({"batch": np.repeat(np.arange(batches), timings),
                           "repeat": np.tile(np.arange(timings), batches),
                           "tokens_spec": 64.0, "total_s_spec": total_s_spec.ravel(), "tokens_ar": 64.0,
                           "total_s_ar": total_s_ar.ravel()})
    return paired, median_speedup * math.exp(-(speedup_sd**2) / 2)


def percentile_bootstrap(paired: pd.DataFrame, rng: np.random.Generator, resamples: int = 1000) -> list[float]:
    """The interval this module gave before: a percentile bootstrap over batches (covers 0.76-0.88 at 4-8)."""
    sums = paired.groupby("batch")[["tokens_spec", "total_s_spec", "tokens_ar", "total_s_ar"]].sum().to_numpy()
    totals = intervals.resample_counts(len(sums), resamples, rng) @ sums  # [R, 4]
    return intervals.percentile_interval((totals[:, 0] / totals[:, 1]) / (totals[:, 2] / totals[:, 3]))


STUDIES = 2000  # simulated studies per batch count


@pytest.mark.parametrize("batches,lowest", [(2, 0.88), (4, 0.88), (8, 0.92), (16, 0.92), (32, 0.92)])
def test_the_speedup_interval_holds_its_level_at_study_sizes(batches, lowest):
    """2000 synthetic studies of heterogeneous batches (the issue's design: per-batch speedup sd 0.2
    in log, AR seconds sd 0.3, timing noise sd 0.05, two timings per batch) at 4, 8, 16 and 32
    batches (and at 2, the fewest that get one): the 95% interval must hold the true speedup in
    [0.92, 0.98] of them at >= 8 batches and >= 0.88 at 2 and 4. It held it 0.936-0.949 of them here.

    Binomial arithmetic (n = 2000): a correct build whose true coverage is 0.935 (the lowest seen)
    fails the 0.92 bound with P(Bin(2000, 0.935) < 1840) < 0.01, and the upper bound with ~0; one
    covering 0.85 passes with P(Bin(2000, 0.85) >= 1840) < 1e-15 (and at 4 batches
    P(Bin(2000, 0.85) >= 1760) < 1e-4): an interval that covers only 0.85 fails with probability
    >= 0.99. The percentile bootstrap this replaced is run on the same studies and must fail."""
    n = STUDIES
    assert binomial_tail_below(n, 0.935, math.ceil(0.92 * n)) < 0.01
    assert 1 - binomial_tail_below(n, 0.85, math.ceil(lowest * n)) < 1e-4
    rng = np.random.default_rng(batches)
    hits, bootstrap_hits = 0, 0
    for study in range(n):
        paired, truth = heterogeneous_study(rng, batches, timings=2)
        lo, hi = intervals.speedup_interval(paired, rng)["speedup_ci95"]
        hits += lo <= truth <= hi
        if batches <= 8 and study < 300:  # the old interval, for the test's power
            lo, hi = percentile_bootstrap(paired, rng)
            bootstrap_hits += lo <= truth <= hi
    assert lowest * n <= hits <= 0.98 * n, f"the speedup interval held the truth in {hits / n:.3f} at {batches} batches"
    if batches <= 8:
        assert bootstrap_hits < lowest * 300, f"the percentile bootstrap held it in {bootstrap_hits / 300:.3f}"


@pytest.mark.parametrize("units", [4, 8, 16, 32])
def test_the_acceptance_intervals_hold_their_level_over_heterogeneous_prompts(units):
    """alpha (a proportion of sums over prompts) and tau (a positive ratio) over prompts that differ:
    each prompt's acceptance Beta(6, 4) (mean 0.6), its positions looked at Poisson(8..60). 1000
    studies per prompt count: coverage of the population value in [0.92, 0.98] (>= 0.88 at 4).
    A build covering 0.935 fails the 0.92 bound with P(Bin(1000, 0.935) < 920) ~ 0.03; one covering
    0.85 passes with P(Bin(1000, 0.85) >= 920) < 1e-8 (at 4 prompts, >= 880: 0.006)."""
    n, lowest = 1000, 0.88 if units == 4 else 0.92
    assert binomial_tail_below(n, 0.935, 920) < 0.04 and 1 - binomial_tail_below(n, 0.85, math.ceil(lowest * n)) < 0.01
    rng = np.random.default_rng(100 + units)
    alpha_hits = tau_hits = 0
    for _ in range(n):
        looked = rng.poisson(rng.uniform(8, 60, units)).astype(float) + 1  # [P]
        accepted = rng.binomial(looked.astype(int), rng.beta(6, 4, units)).astype(float)
        lo, hi = intervals.proportion_interval(accepted, looked)
        alpha_hits += lo <= 0.6 <= hi
        rounds = looked  # tau: emitted / rounds, each round 1 + a prompt's mean accepted run (a ratio >= 1)
        emitted = rounds + accepted
        lo, hi = intervals.log_t_interval(emitted, rounds)
        tau_hits += lo <= 1.6 <= hi
    for name, hits in (("alpha", alpha_hits), ("tau", tau_hits)):
        assert lowest * n <= hits <= 0.98 * n, (f"the {name} interval held the truth in {hits / n:.3f} "
                                                f"at {units} prompts")


def test_too_few_units_get_no_interval_and_say_why():
    """Below MIN_UNITS (2) batches (prompts) a number gets no interval, and its note says why; never [s, s]."""
    rng = np.random.default_rng(0)
    got = intervals.speedup_interval(heterogeneous_study(rng, 1, timings=4)[0], rng)
    assert got["speedup_ci95"] is None and got["speedup_halfwidth"] is None
    assert got["speedup_note"] == "batches: 1, fewer than 2"
    two = intervals.speedup_interval(heterogeneous_study(rng, 2, timings=4)[0], rng)["speedup_ci95"]
    assert two is not None and two[1] > two[0]
    rounds = pd.DataFrame({"prompt_id": ["a", "a", "b", "c", "c"], "proposed": [3, 3, 3, 3, 3],
                           "accepted": [3, 1, 0, 1, 0], "emitted": [4, 2, 1, 2, 1]})
    cis = intervals.acceptance_intervals(rounds, 3)
    assert cis["alpha_ci95"] is not None and cis["tau_ci95"] is not None
    # position 2 is reached by prompts a and c, position 3 by a only
    assert None not in cis["acceptance_curve_ci95"][:2] and cis["acceptance_curve_ci95"][2] is None
    assert cis["interval_notes"] == {"acceptance_curve[3]": "prompts: 1, fewer than 2"}
    never = intervals.acceptance_intervals(rounds.assign(proposed=0, accepted=0, emitted=1), 3)  # the A/A control's
    assert never["tau_ci95"] is None and never["interval_notes"]["tau"] == "no draft tokens: tau is 1 by construction"
    assert never["alpha_ci95"] is None and "alpha" not in never["interval_notes"]  # no alpha at all: nothing to explain
    assert intervals.fmt_interval(1.5, None, note="batches: 1, fewer than 2") == \
        "1.500 (no interval: batches: 1, fewer than 2)"


def test_an_all_accepted_proportion_gets_a_one_sided_interval():
    """Every position accepted (no spread to see): Clopper-Pearson at the trials in all (60, as 12.5
    once three prompts' t quantile widens it), [0.745, 1], not [1, 1]; more prompts narrow it."""
    lo, hi = intervals.proportion_interval(np.array([10.0, 20, 30]), np.array([10.0, 20, 30]))
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / (60 * (1.959964 / 4.302653) ** 2)), rel=1e-4)
    lo_more, _ = intervals.proportion_interval(np.full(12, 20.0), np.full(12, 20.0))
    assert lo < lo_more < 1.0


def test_noise_and_between_batch_halfwidths_split_what_repeats_can_narrow():
    rng = np.random.default_rng(0)
    same = synthetic_timings(rng, 1.0, repeats=4)  # every batch at the same true speedup
    split = intervals.speedup_interval(same, rng)
    assert split["between_batch_halfwidth"] < split["noise_halfwidth"]
    differing = synthetic_timings(rng, 1.0, repeats=4, noise=0.01)  # batches whose speedups truly differ:
    differing["total_s_spec"] *= np.where(differing["batch"] % 2 == 0, 0.7, 1.3)
    split = intervals.speedup_interval(differing, rng)
    assert split["between_batch_halfwidth"] > 5 * split["noise_halfwidth"]
    once = intervals.speedup_interval(synthetic_timings(rng, 1.0, repeats=1), rng)
    # one timing says nothing of noise alone
    assert once["noise_halfwidth"] is None and once["speedup_ci95"] is not None


def two_stage_study(rng: np.random.Generator, settings: TimingSettings, batches: int,
                    **design) -> tuple[dict, float, int]:
    """One study timed as run_study times it: the pilot's passes, the passes the pilot plans, the
    interval of all of them (the pilot marked); returns the interval, the truth and the passes."""
    per_pass = timing.TIMINGS_PER_PASS
    paired, truth = heterogeneous_study(rng, batches, per_pass * settings.max_repeats, **design)
    paired["pilot"] = paired["repeat"] < per_pass * settings.repeats
    pilot = paired[paired["pilot"]]
    passes, _ = timing.plan_passes(settings, intervals.speedup_spread(pilot), intervals.paired_speedup(pilot), 1.0)
    timed = paired[paired["repeat"] < per_pass * passes]
    return intervals.speedup_interval(timed), truth, passes


@pytest.mark.parametrize("batches,target", [(8, 0.06), (16, 0.04)])
def test_the_timing_plan_keeps_the_intervals_level(batches, target):
    """Timing noise dominating (sd 0.15 per timing, batches' speedups sd 0.03), a target half-width
    the pilot rarely meets: stopping the first time the interval looked narrow held the truth in
    only 0.89-0.91 of such studies; the two-stage plan (passes planned from the pilot, the pilot's
    variance) must hold it in >= 0.93 of 1000 (0.96-0.98 here), and does time more passes than the
    pilot in most of them. A build covering 0.95 fails with P(Bin(1000, 0.95) < 930) ~ 2e-3; one
    covering 0.90 passes with P(Bin(1000, 0.90) >= 930) < 1e-3."""
    assert binomial_tail_below(1000, 0.95, 930) < 3e-3 and 1 - binomial_tail_below(1000, 0.90, 930) < 1e-3
    settings = TimingSettings(repeats=1, target_halfwidth=target, max_repeats=8, budget_s=1e9)
    rng = np.random.default_rng(batches)
    hits, more = 0, 0
    for _ in range(1000):
        interval, truth, passes = two_stage_study(rng, settings, batches, speedup_sd=0.03, noise=0.15)
        lo, hi = interval["speedup_ci95"]
        hits += lo <= truth <= hi
        more += passes > 1
    assert hits >= 930, f"the planned timing's interval held the truth in {hits / 1000:.3f}"
    assert more > 500


def test_plan_passes_reasons():
    """The plan from a pilot's spread: 8 batches timed twice, all of whose spread is timing noise
    (var 0.02 per timing: +-0.084 after the pilot, t with 7 dof), or mostly between batches."""
    noise = intervals.SpeedupSpread(batches=8, timings=2, batch_means=0.01, within=0.02)
    settings = TimingSettings(repeats=1, target_halfwidth=0.05, max_repeats=8, budget_s=1e6)
    assert timing.plan_passes(TimingSettings(target_halfwidth=None), noise, 1.0, 1.0) == (1, "repeats")
    assert intervals.halfwidth_at(noise, 1.0, 2) == pytest.approx(math.sinh(2.364624 * math.sqrt(0.01 / 8)), rel=1e-5)
    assert timing.plan_passes(TimingSettings(target_halfwidth=0.09), noise, 1.0, 1.0) == (1, "reached")
    # then the noise alone, 8 x (2 - 1) dof: +-0.05 needs 0.02 / (8 n) <= (0.05 / 2.306)^2, n >= 5.3 timings: 3 passes
    assert timing.plan_passes(settings, noise, 1.0, 1.0) == (3, "planned")
    assert intervals.halfwidth_at(noise, 1.0, 6) <= 0.05 < intervals.halfwidth_at(noise, 1.0, 4)
    assert timing.plan_passes(TimingSettings(target_halfwidth=0.03, budget_s=100), noise, 1.0, 60.0) == (2, "budget")
    assert timing.plan_passes(TimingSettings(target_halfwidth=1e-4, max_repeats=4, budget_s=1e6), noise, 1.0, 1.0) \
        == (4, "max_repeats")
    apart = intervals.SpeedupSpread(batches=8, timings=2, batch_means=0.05, within=0.002)  # repeats won't help
    assert timing.plan_passes(settings, apart, 1.0, 1.0) == (1, "between_batches")
    assert timing.plan_passes(settings, None, None, 1.0) == (1, "no_interval")
    wide = {"speedup_halfwidth": 0.08, "noise_halfwidth": 0.07, "between_batch_halfwidth": 0.02}
    budget = TimingSettings(target_halfwidth=0.05, budget_s=100)
    message = timing.stop_message("budget", budget, 3, wide)
    assert "+-0.080 after 3" in message and "timing.budget_s=100" in message
    assert "timing.budget_s=100" in timing.stop_message("budget", budget, 3, wide | {"between_batch_halfwidth": None})
    assert timing.stop_message("planned", budget, 3, wide) is None


class FakeClock:
    """Seconds that pass per call: ~1 ms, and a 20-50 ms stall one call in 20 (a noisy machine);
    ``steady``: exactly 1 ms per call."""

    def __init__(self, seed: int, steady: bool = False):
        self.rng, self.now, self.steady = np.random.default_rng(seed), 0.0, steady

    def __call__(self) -> float:
        if self.steady:
            self.now += 1e-3
        else:
            self.now += 1e-3 * self.rng.lognormal(0, 0.3) + (self.rng.random() < 0.05) * self.rng.uniform(0.02, 0.05)
        return self.now


def aa_study(target, seed: int, settings: TimingSettings, steady: bool = False) -> Study:
    prompts = [Prompt(id=str(i), text="", category=f"c{i % 4}") for i in range(8)]
    encoded = [[5 + i, 6, 7 + i % 3] for i in range(8)]
    return Study(target, NoDrafter(target), 0, prompts, encoded, SamplingConfig(), 8, 1, True, seed, target.model, {},
                 timing=settings, clock=FakeClock(seed, steady))


def run(study: Study, folder) -> dict:
    results = JobResults(folder, "test")
    results.begin("")
    return run_study(study, results, NullTracker())


def test_the_aa_control_through_run_study_is_one_on_a_steady_clock(tmp_path, target):
    """draft=none under a clock that ticks the same for every call: both arms must read it exactly
    as often (the same path, nothing extra timed in one arm), so the speedup is 1 and its interval
    [1, 1]. The timings table pairs each batch's arms, each going first once in every pass (A B B A)."""
    summary = run(aa_study(target, 0, TimingSettings(repeats=2, target_halfwidth=None, resamples=200), steady=True),
                  tmp_path)
    assert summary["speedup"] == pytest.approx(1.0, abs=1e-9)
    assert summary["speedup_ci95"] == pytest.approx([1.0, 1.0], abs=1e-9)
    assert summary["timing"]["passes"] == 2 and summary["tau"] == 1.0 and summary["alpha"] is None
    assert summary["predicted_speedup"] is None  # no profile here; with one, the model predicts 1.0 (test_cli)
    batches = pd.read_parquet(tmp_path / "batches.parquet")
    assert len(batches) == 8 * 2 * 2 * 2 and set(batches["repeat"]) == {0, 1, 2, 3} and batches["pilot"].all()
    firsts = batches[batches["mode"] == "spec"].set_index(["batch", "repeat"])["first"]
    for a, b in ((0, 1), (2, 3)):  # each pass, each batch: each arm first once
        assert (firsts.xs(a, level="repeat") != firsts.xs(b, level="repeat")).all()
    assert (firsts.xs(0, level="repeat").to_numpy() == ["ar", "spec"] * 4).all()
    assert (firsts == "spec").sum() == (firsts == "ar").sum()  # balanced whatever the number of batches


def test_timing_passes_stop_at_the_target_halfwidth(tmp_path, target):
    """A loose target is met after the minimum passes; an unreachable one stops at max_repeats
    (the budget is ample) and says so."""
    loose = run(aa_study(target, 0, TimingSettings(repeats=2, target_halfwidth=10.0, max_repeats=5, resamples=200)),
                tmp_path / "loose")
    assert loose["timing"]["passes"] == 2 and loose["timing"]["stopped"] == "reached"
    tight = run(aa_study(target, 0, TimingSettings(repeats=1, target_halfwidth=1e-6, max_repeats=3, resamples=200,
                                                   budget_s=1e6)), tmp_path / "tight")
    assert tight["timing"]["passes"] == 3 and tight["timing"]["stopped"] in ("max_repeats", "between_batches")


def test_repeated_passes_repeat_the_same_work(tmp_path, target, other_draft):
    """Later passes time the same decode again: same tokens per batch and arm in every pass (greedy)."""
    from specexp.drafts.small_lm import SmallLMDrafter

    study = aa_study(target, 0, TimingSettings(repeats=3, target_halfwidth=None, resamples=200))
    study.drafter, study.k_max = SmallLMDrafter(target, other_draft, k=2), 2
    summary = run(study, tmp_path)
    batches = pd.read_parquet(tmp_path / "batches.parquet")
    assert batches.groupby(["mode", "batch"])["tokens"].nunique().eq(1).all()
    assert summary["greedy_match"] == 1.0 and summary["alpha_ci95"] is not None
    assert (len(summary["acceptance_curve_ci95"]) == 2
            and summary["acceptance_curve_ci95"][0][0] <= summary["acceptance_curve"][0])


def test_timing_settings_reject_bad_values():
    from specexp.errors import UserInputError

    for bad in ({"repeats": 0}, {"repeats": 3, "max_repeats": 2}, {"target_halfwidth": 0}, {"budget_s": -1}):
        with pytest.raises(UserInputError, match="timing"):
            TimingSettings(**bad)


def test_the_no_draft_never_proposes(target, prompts):
    out = generate(target.model, prompts, NoDrafter(target), SamplingConfig(), 8, NO_EOS,
                   torch.Generator().manual_seed(0))
    alone = generate(target.model, prompts, None, SamplingConfig(), 8, NO_EOS, torch.Generator().manual_seed(0))
    assert out.tokens == alone.tokens and out.n_proposed.sum() == 0 and set(out.k_chosen) == {0}


@pytest.mark.default_target
def test_the_aa_control_experiment_runs_every_never_proposing_draft(tmp_path):
    """`experiment=aa_control size=smoke`: draft=none and draft.k=0 of two shipped drafts run as the
    speculative arm; every job decodes as AR (tau 1, greedy identical), the cost model predicts 1.0,
    and the collected table carries the speedup's interval."""
    from tests.commands import run_module, run_specexp

    sweep = tmp_path / "aa"
    out = run_specexp("experiment=aa_control", "size=smoke", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(sweep.glob("*/summary.json"))
    assert len(jobs) == 3, out.stdout
    for job in jobs:
        summary = json.loads(job.read_text())
        assert summary["mean_k"] == 0 and summary["tau"] == 1.0 and summary["greedy_match"] == 1.0
        assert summary["predicted_speedup"] == pytest.approx(1.0) and summary["speedup_ci95"] is not None
        assert set(summary["speedup_by_first_arm"]) == {"ar", "spec"}
    assert {json.loads(j.read_text())["draft"] for j in jobs} == {"none", "prompt_lookup", "distilled"}
    table = run_module("specexp.collect", str(sweep))
    collected = pd.read_parquet(sweep / "collected.parquet")
    assert table.returncode == 0 and collected["speedup_ci95_lo"].notna().all() and "[" in table.stdout
    # its record, written by the script from what the jobs measured: each job's section, 1.00 judged
    # against its interval
    record = tmp_path / "aa_control.md"
    script = REPO / "benchmarks" / "aa_control.py"
    written = subprocess.run([sys.executable, str(script), str(sweep), "--out", str(record)],
                             capture_output=True, text=True)
    assert written.returncode == 0, written.stderr[-2000:]
    text = record.read_text()
    assert text.count("\n## ") == 3 and text.count("1.00 inside the interval") + text.count("1.00 **outside**") == 3
    summary = json.loads(jobs[0].read_text())
    assert f"speedup {summary['speedup']:.3f} [{summary['speedup_ci95'][0]:.3f}" in text  # the job's own numbers
