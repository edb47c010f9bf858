"""Intervals on every headline number (specexp.study.intervals), the timing passes that narrow the
speedup's (specexp.study.timing), and the A/A control (draft=none) they are checked on.

Coverage tests repeat a whole measurement over seeds and count how often its 95% interval holds
the truth. Each states its false-failure probability for a correct build; the seeds are fixed,
so a given build passes or fails deterministically.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import Prompt
from specexp.drafts.none import NoDrafter
from specexp.drafts.oracle import OracleDrafter, greedy_continuations
from specexp.study import intervals, timing
from specexp.study.run import Study, round_table, run_study
from specexp.study.timing import TimingSettings
from specexp.study.tracking import JobResults, NullTracker
from tests.conftest import tiny_model

NO_EOS = [10**6]


def binomial_tail_below(n: int, p: float, k: int) -> float:
    """P(X < k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k))


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
                         "total_s_ar": base * rng.lognormal(0, noise), "total_s_spec": base / ratio * rng.lognormal(0, noise)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("ratio", [1.0, 1.25])
def test_the_speedup_interval_covers_a_known_ratio_at_about_95_percent(ratio):
    """Timings whose true speedup is known (noise ~10% per timing, as measured on these machines):
    over 200 seeds the paired bootstrap over 8 batches (3 timings each) must hold the ratio at least
    170 times (it held it 185 times here: a percentile bootstrap over 8 units runs a little under
    95%). At a true coverage of 0.92, P(fewer than 170) < 4e-4 (below); drawing each batch's
    repeats as well, which counts the noise twice, covered 99%, and an interval blind to the
    noise would cover far less."""
    hits = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        paired = synthetic_timings(rng, ratio)
        ci = intervals.speedup_interval(paired, rng, resamples=500)["speedup_ci95"]
        hits += ci[0] <= ratio <= ci[1]
    assert binomial_tail_below(200, 0.92, 170) < 4e-4
    assert hits >= 170, f"the speedup interval held {ratio} in {hits} of 200 seeds"


def test_noise_and_between_batch_halfwidths_split_what_repeats_can_narrow():
    rng = np.random.default_rng(0)
    same = synthetic_timings(rng, 1.0, repeats=4)  # every batch at the same true speedup
    split = intervals.speedup_interval(same, rng, resamples=1000)
    assert split["between_batch_halfwidth"] < split["noise_halfwidth"]
    differing = synthetic_timings(rng, 1.0, repeats=4, noise=0.01)  # batches whose speedups truly differ:
    differing["total_s_spec"] *= np.where(differing["batch"] % 2 == 0, 0.7, 1.3)
    split = intervals.speedup_interval(differing, rng, resamples=1000)
    assert split["between_batch_halfwidth"] > 5 * split["noise_halfwidth"]
    once = intervals.speedup_interval(synthetic_timings(rng, 1.0, repeats=1), rng, resamples=200)
    assert once["noise_halfwidth"] is None and once["speedup_ci95"] is not None  # one timing says nothing of noise alone


def test_stop_reasons():
    settings = TimingSettings(repeats=2, target_halfwidth=0.03, max_repeats=4, budget_s=100)
    wide = {"speedup_halfwidth": 0.08, "noise_halfwidth": 0.07, "between_batch_halfwidth": 0.02}
    assert timing.stop_reason(settings, 1, wide, 0, 10) is None  # fewer than `repeats` passes
    assert timing.stop_reason(settings, 2, wide, 0, 10) is None
    assert timing.stop_reason(settings, 2, wide | {"speedup_halfwidth": 0.02}, 0, 10) == "reached"
    assert timing.stop_reason(settings, 2, wide | {"between_batch_halfwidth": 0.05}, 0, 10) is None  # estimated from 3 on
    assert timing.stop_reason(settings, 3, wide | {"between_batch_halfwidth": 0.05}, 0, 10) is None  # noise is wider
    assert timing.stop_reason(settings, 3, wide | {"between_batch_halfwidth": 0.075}, 0, 10) == "between_batches"
    assert timing.stop_reason(settings, 4, wide, 0, 10) == "max_repeats"
    assert timing.stop_reason(settings, 3, wide, 95, 10) == "budget"
    message = timing.stop_message("budget", settings, 3, wide)
    assert "+-0.080 after 3" in message and "timing.budget_s=100" in message
    # one batch (one prompt) has no between-batch spread: the budget line is still one line, not a crash
    assert "timing.budget_s=100" in timing.stop_message("budget", settings, 3, wide | {"between_batch_halfwidth": None})
    assert timing.stop_reason(TimingSettings(target_halfwidth=None), 1, wide, 0, 0) == "repeats"


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
    [1, 1]. The timings table pairs each batch's arms, each going first once over two passes."""
    summary = run(aa_study(target, 0, TimingSettings(repeats=2, target_halfwidth=None, resamples=200), steady=True),
                  tmp_path)
    assert summary["speedup"] == pytest.approx(1.0, abs=1e-9)
    assert summary["speedup_ci95"] == pytest.approx([1.0, 1.0], abs=1e-9)
    assert summary["timing"]["passes"] == 2 and summary["tau"] == 1.0 and summary["alpha"] is None
    assert summary["predicted_speedup"] is None  # no profile here; with one, the model predicts 1.0 (test_cli)
    batches = pd.read_parquet(tmp_path / "batches.parquet")
    assert len(batches) == 8 * 2 * 2 and set(batches["repeat"]) == {0, 1}
    firsts = batches[batches["mode"] == "spec"].set_index(["batch", "repeat"])["first"]
    assert (firsts.xs(0, level="repeat") != firsts.xs(1, level="repeat")).all()  # each batch: each arm first once
    assert (firsts.xs(0, level="repeat").to_numpy() == ["ar", "spec"] * 4).all()


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
    assert len(summary["acceptance_curve_ci95"]) == 2 and summary["acceptance_curve_ci95"][0][0] <= summary["acceptance_curve"][0]


def test_timing_settings_reject_bad_values():
    from specexp.errors import UserInputError

    for bad in ({"repeats": 0}, {"repeats": 3, "max_repeats": 2}, {"target_halfwidth": 0}, {"budget_s": -1}):
        with pytest.raises(UserInputError, match="timing"):
            TimingSettings(**bad)


def test_the_no_draft_never_proposes(target, prompts):
    out = generate(target.model, prompts, NoDrafter(target), SamplingConfig(), 8, NO_EOS, torch.Generator().manual_seed(0))
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
    assert {json.loads(j.read_text())["draft"] for j in jobs} == {"NoDrafter", "PromptLookupDrafter", "SmallLMDrafter"}
    table = run_module("specexp.collect", str(sweep))
    collected = pd.read_parquet(sweep / "collected.parquet")
    assert table.returncode == 0 and collected["speedup_ci95_lo"].notna().all() and "[" in table.stdout
