"""How long a study times its arms: `timing.repeats` passes over every batch at least, then more
until the speedup's interval is as narrow as `timing.target_halfwidth`, within `timing.budget_s`.

A pass times every batch once in each arm, interleaved (the arm that goes first alternates by
batch and by pass). The first pass also records what was decoded (tokens, acceptance); later
passes repeat the same work for its timings only: the same prompts, seeds and K-policy state
as the first, so identical work is timed again.
"""

from dataclasses import dataclass

from specexp.errors import UserInputError

# The spread between batches is estimated from 3 passes on; it stops the passes only when it is
# clearly (this many times) wider than the target and wider than the timing noise, since the
# estimate is itself noisy (one disturbed pass inflates it).
BETWEEN_MARGIN = 1.5


@dataclass
class TimingSettings:
    repeats: int = 1  # passes over every batch, at least (each times both arms once per batch)
    # More passes until the speedup's 95% interval is within +-this (speedup units); null: `repeats` passes.
    target_halfwidth: float | None = 0.03
    max_repeats: int = 8  # passes at most
    budget_s: float = 120.0  # seconds the passes after `repeats` may take in all
    resamples: int = 2000  # bootstrap resamples per interval

    def __post_init__(self):
        if self.repeats < 1 or self.max_repeats < self.repeats:
            raise UserInputError(f"timing.repeats={self.repeats}, timing.max_repeats={self.max_repeats} are not allowed; "
                                 "give 1 <= repeats <= max_repeats")
        if self.target_halfwidth is not None and self.target_halfwidth <= 0:
            raise UserInputError(f"timing.target_halfwidth={self.target_halfwidth} must be > 0 (or null)")
        if self.budget_s < 0 or self.resamples < 100:
            raise UserInputError(f"timing.budget_s={self.budget_s} must be >= 0 and timing.resamples={self.resamples} "
                                 ">= 100")


def stop_reason(settings: TimingSettings, passes: int, interval: dict, extra_s: float, last_pass_s: float) -> str | None:
    """Why no further pass is timed (None: time another). ``interval``: `intervals.speedup_interval`
    of the passes so far; ``extra_s``: seconds spent on passes beyond `repeats`."""
    if passes < settings.repeats:
        return None
    halfwidth = interval.get("speedup_halfwidth")
    if settings.target_halfwidth is None:
        return "repeats"
    if halfwidth is not None and halfwidth <= settings.target_halfwidth:
        return "reached"
    between, noise = interval.get("between_batch_halfwidth"), interval.get("noise_halfwidth")
    if passes >= 3 and between is not None and between > max(BETWEEN_MARGIN * settings.target_halfwidth, noise or 0.0):
        return "between_batches"  # the batches differ by more than the target: more prompts would help, repeats not
    if passes >= settings.max_repeats:
        return "max_repeats"
    if extra_s + last_pass_s > settings.budget_s:
        return "budget"
    return None


def stop_message(reason: str, settings: TimingSettings, passes: int, interval: dict) -> str | None:
    """One line for a study that could not narrow its speedup interval to the target (None if it did
    or had no target)."""
    if reason in ("reached", "repeats") or interval.get("speedup_halfwidth") is None:
        return None
    got = f"speedup interval +-{interval['speedup_halfwidth']:.3f} after {passes} timing pass(es) per batch, wider than " \
          f"timing.target_halfwidth={settings.target_halfwidth}"
    if reason == "between_batches":  # (only then is the between-batch half-width known to be set)
        why = (f"the batches themselves differ (+-{interval['between_batch_halfwidth']:.3f} with noise-free timings): "
               "more prompts (data.limit) would narrow it, more repeats would not")
    elif reason == "max_repeats":
        why = f"timing.max_repeats={settings.max_repeats} reached"
    else:
        why = f"another pass would exceed timing.budget_s={settings.budget_s:g}"
    return f"{got}: {why}"
