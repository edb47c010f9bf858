"""How long a study times its arms: `timing.repeats` pilot passes over every batch, then as many
more as the pilot says the speedup's interval needs to be as narrow as `timing.target_halfwidth`,
within `timing.max_repeats` and `timing.budget_s`.

A pass times every batch twice in each arm, in the order A B B A (the arm that leads alternating by
batch): each arm runs first and second equally often in every batch, so an order effect (the second
decode of a pair runs faster; docs/lab_notes/code_measurements.md: order effect) cancels for any
number of batches, and linear drift within the four decodes cancels too. The first pass also records
what was decoded (tokens, acceptance); every other decode repeats the same work for its timings only:
the same prompts, seeds and K-policy state, so identical work is timed again.

The passes after the pilot are planned from the pilot alone and then all timed: Stein's two-stage
design. Looking at the interval after every pass and stopping once it looked narrow would stop
where its width was underestimated (coverage 0.89-0.91 for a nominal 0.95 in
tests/study/test_intervals.py's simulation); with the plan and the pilot's variance the interval of all
passes holds its level.
"""

import math
from dataclasses import dataclass

from specexp.errors import UserInputError
from specexp.study import intervals
from specexp.study.intervals import SpeedupSpread

TIMINGS_PER_PASS = 2  # of each arm, per batch: A B B A

# The spread between batches is estimated from the pilot; it stops the timing only when it is
# clearly (this many times) wider than the target, since the estimate is itself noisy.
BETWEEN_MARGIN = 1.5


@dataclass
class TimingSettings:
    repeats: int = 1  # pilot passes over every batch (each times both arms twice per batch, A B B A)
    # More passes until the speedup's 95% interval is within +-this (speedup units); null: `repeats` passes.
    target_halfwidth: float | None = 0.03
    max_repeats: int = 8  # passes at most
    budget_s: float = 120.0  # seconds the passes after `repeats` may take in all
    resamples: int = 2000  # bootstrap resamples, where an interval resamples (the headline intervals are analytic)

    def __post_init__(self):
        if self.repeats < 1 or self.max_repeats < self.repeats:
            raise UserInputError(f"timing.repeats={self.repeats}, timing.max_repeats={self.max_repeats} "
                                 "are not allowed; give 1 <= repeats <= max_repeats")
        if self.target_halfwidth is not None and self.target_halfwidth <= 0:
            raise UserInputError(f"timing.target_halfwidth={self.target_halfwidth} must be > 0 (or null)")
        if self.budget_s < 0 or self.resamples < 100:
            raise UserInputError(f"timing.budget_s={self.budget_s} must be >= 0 and timing.resamples={self.resamples} "
                                 ">= 100")


def plan_passes(settings: TimingSettings, spread: SpeedupSpread | None, speedup: float | None,
                pass_s: float) -> tuple[int, str]:
    """How many passes in all, and why, from the pilot's `repeats` passes alone: ``spread``,
    ``speedup`` of the pilot (`intervals.speedup_spread`, None without an interval) and the seconds
    one pass took."""
    pilot = settings.repeats
    if settings.target_halfwidth is None:
        return pilot, "repeats"
    if spread is None or speedup is None or spread.within is None:
        return pilot, "no_interval"
    target = settings.target_halfwidth
    if intervals.halfwidth_at(spread, speedup, TIMINGS_PER_PASS * pilot) <= target:
        return pilot, "reached"
    between = speedup * math.sinh(intervals.t_quantile(spread.batches - 1) * math.sqrt(spread.between / spread.batches))
    if between > BETWEEN_MARGIN * target:
        # the batches differ by more than the target: more prompts would help, repeats not
        return pilot, "between_batches"
    affordable = pilot + (int(settings.budget_s // pass_s) if pass_s > 0 else settings.max_repeats)
    for passes in range(pilot + 1, settings.max_repeats + 1):
        if passes > affordable:
            return passes - 1, "budget"
        if intervals.halfwidth_at(spread, speedup, TIMINGS_PER_PASS * passes) <= target:
            return passes, "planned"
    return settings.max_repeats, "max_repeats"


def stop_message(reason: str, settings: TimingSettings, passes: int, interval: dict) -> str | None:
    """One line for a study that could not narrow its speedup interval to the target (None if it did,
    had no target, or there is no interval: its note says why)."""
    if reason in ("reached", "planned", "repeats", "no_interval") or interval.get("speedup_halfwidth") is None:
        return None
    if interval["speedup_halfwidth"] <= settings.target_halfwidth:
        return None
    got = f"speedup interval +-{interval['speedup_halfwidth']:.3f} after {passes} timing pass(es) per batch, " \
          f"wider than timing.target_halfwidth={settings.target_halfwidth}"
    if reason == "between_batches" and interval.get("between_batch_halfwidth") is not None:
        why = (f"the batches themselves differ (+-{interval['between_batch_halfwidth']:.3f} with noise-free timings): "
               "more prompts (data.limit) would narrow it, more repeats would not")
    elif reason == "max_repeats":
        why = f"timing.max_repeats={settings.max_repeats} reached"
    else:
        why = f"more passes would exceed timing.budget_s={settings.budget_s:g}"
    return f"{got}: {why}"
