"""The run summary (summary.json) as one typed record, and the one function that measures a slice of
a study.

`arm_metrics(rounds, batches)` is what any slice of a study measures (the whole run, a category, a
prompt): alpha, tau, throughputs and speedup, each defined in specexp.core.metrics. `RunSummary`
holds the run's `ArmMetrics` and everything else summary.json says; each field's metadata says
whether it is a headline number (W&B's history rows), has a 95% interval (`FIELD_ci95`, printed with
the number), is printed at the end of a run, or is a column of the collected table. The key lists
the collected table, W&B, the printed table and the intervals read are `keys(...)` of it, not lists
of their own.
"""

from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pandas as pd

from specexp.core import metrics
from specexp.costs import cost_model
from specexp.costs.hardware_profile import Profile
from specexp.study import intervals


def metric(doc: str, *, headline: bool = False, interval: bool = False, shown: bool = False,
           collected: bool = False):
    """A summary field (None until measured): ``doc`` says what it is; the flags where it appears."""
    return field(default=None, metadata={"doc": doc, "headline": headline, "interval": interval, "shown": shown,
                                         "collected": collected})


@dataclass
class ArmMetrics:
    """What a slice of a study measures: the speculative arm's rounds against the AR arm's timings."""

    alpha: float | None = metric("accepted / looked-at draft positions (a tree's: per depth along the accepted "
                                 "path)", headline=True, interval=True, shown=True, collected=True)
    drafted_acceptance_rate: float | None = metric("accepted / proposed draft tokens (a tree's: accepted path / "
                                                   "nodes)", collected=True)
    tau: float | None = metric("tokens committed per round", headline=True, interval=True, shown=True, collected=True)
    tokens_per_s_spec: float | None = metric("the speculative arm's tokens per second of whole decodes",
                                             shown=True, collected=True)
    tokens_per_s_ar: float | None = metric("the AR arm's tokens per second, same prompts", shown=True, collected=True)
    speedup: float | None = metric("spec tokens/s over AR tokens/s on the same prompts (under greedy: AR seconds "
                                   "over spec seconds)", headline=True, interval=True, shown=True, collected=True)


def arm_metrics(rounds: pd.DataFrame, batches: pd.DataFrame | None) -> ArmMetrics:
    """The metrics of ``rounds`` (one row per prompt and round, both arms: study/run.py's round_table)
    timed by ``batches`` (one row per decode and arm: tokens, total_s; None: not timed apart, as a
    category whose batches mix categories, and then no throughput or speedup)."""
    spec, _ = metrics.arms(rounds)
    accepted = spec["accepted"].to_numpy()
    tps_spec = tps_ar = None
    if batches is not None:
        spec_b, ar_b = metrics.arms(batches)
        tps_spec, tps_ar = metrics.tokens_per_s(spec_b), metrics.tokens_per_s(ar_b)
    return ArmMetrics(
        alpha=metrics.alpha(metrics.positions(spec), accepted),  # a tree's positions are its depths
        drafted_acceptance_rate=metrics.drafted_acceptance_rate(spec["proposed"].to_numpy(), accepted),
        tau=metrics.tau(spec["emitted"].to_numpy()),
        tokens_per_s_spec=tps_spec,
        tokens_per_s_ar=tps_ar,
        speedup=metrics.safe_ratio(tps_spec, tps_ar) if tps_spec is not None and tps_ar else None,
    )


@dataclass
class RunSummary(ArmMetrics):
    """One study's summary.json (`to_dict`). The whole run's ArmMetrics, then:"""

    # 95% intervals (specexp.study.intervals): alpha, tau, the curve over prompts; speedup over batches and timings
    alpha_ci95: list[float] | None = metric("alpha's 95% interval over prompts")
    tau_ci95: list[float] | None = metric("tau's 95% interval over prompts")
    acceptance_curve_ci95: list | None = metric("each position's 95% interval over prompts")
    speedup_ci95: list[float] | None = metric("the speedup's 95% interval over batches and their timings")
    interval_notes: dict | None = metric("why a number has no interval (fewer than intervals.MIN_UNITS units)")
    interval_units: dict | None = metric("the units the intervals are over: prompts and batches")
    speedup_by_first_arm: dict | None = metric("the speedup over the timings in which each arm ran first: apart, "
                                               "an order effect of the arms")
    acceptance_curve: list | None = metric("P(position/depth i accepted | earlier ones accepted), i = 1..k",
                                           shown=True)
    accepted_length_histogram: list[int] | None = metric("rounds accepting 0..k draft tokens")
    nodes_per_pass: float | None = metric("draft tokens verified per row and round", collected=True)
    accepted_per_pass: float | None = metric("draft tokens accepted per row and round", collected=True)
    k_max: int | None = metric("the K a fixed-K run ran, the most a K policy could choose (summaries before "
                                "2026-12-07: `k`, read by k_max_of)")
    mean_k: float | None = metric("K asked of the draft per round (k itself unless draft.k=auto/heuristic)",
                                  shown=True, collected=True)
    cost_ratio_c: float | None = metric("c: draft seconds per drafted position / one AR target step",
                                        headline=True, shown=True, collected=True)
    verify_cost_ratio: float | None = metric("a speculative target pass (K + 1 tokens) / one AR step",
                                             shown=True, collected=True)
    predicted_speedup: float | None = metric("the cost model's, from the run's per-position acceptance and this "
                                             "machine's profile (specexp.costs.cost_model)", headline=True,
                                             shown=True, collected=True)
    predicted_tokens_per_round: float | None = metric("the cost model's tokens per round", collected=True)
    predicted_time_split: dict | None = metric("the cost model's seconds by part")
    profile: str | None = metric("the hardware profile the prediction priced with", collected=True)
    realized_over_predicted: float | None = metric("speedup / predicted_speedup", headline=True, shown=True,
                                                   collected=True)
    predicted_speedup_iid: float | None = metric("Leviathan et al.'s i.i.d. formula with alpha, c and the mean K "
                                                 "(a verify pass priced as one AR step)", shown=True, collected=True)
    time_split: dict | None = metric("seconds of the speculative run by part")
    reencode_ms_per_round: float | None = metric("mean milliseconds a drafted round spent re-encoding text (a "
                                                 "cross-vocabulary draft's tokenizer tax)", collected=True)
    rounds_spec: int | None = metric("speculative rounds (once per batch round)")
    rounds_ar: int | None = metric("AR rounds (once per batch round)")
    tokens_spec: int | None = metric("tokens the speculative arm's first pass emitted")
    tokens_ar: int | None = metric("tokens the AR arm's first pass emitted")
    per_category: dict[str, ArmMetrics] | None = metric("each prompt category's ArmMetrics (its speedup only where "
                                                        "batches never mix categories)")
    timing: dict | None = metric("the timing passes: how many, why they stopped (specexp.study.timing)")
    k_policy: str | None = metric("fixed, auto or heuristic", collected=True)
    draft_profile: str | None = metric("the draft's entry in the profile (profile.json)")
    greedy_match: float | None = metric("fraction of prompts whose speculative tokens equal the AR baseline's "
                                        "(greedy only)", shown=True, collected=True)
    greedy_divergences: list | None = metric("where greedy arms differ: the first divergence's logit gap in "
                                             "rounding steps (study/divergence.py)")
    n_prompts: int | None = metric("prompts studied", shown=True, collected=True)
    target: str | None = metric("the target's name", collected=True)
    draft: str | None = metric("the draft's config name (conf/draft/NAME.yaml: distilled, target_prefix)")
    vocab_overlap: float | None = metric("share of the draft's vocabulary the target's holds", collected=True)
    runtime: dict | None = metric("the runtime's settings and counters (runtime.compile=true: compiled_passes per "
                                  "role, target and draft)")
    status: str | None = metric("ok: the job's files are all written (study/results.JobResults.finish)")
    config_hash: str | None = metric("the job's config, hashed: a rerun of the same config in the same folder "
                                     "skips the finished job")

    def to_dict(self) -> dict:
        """summary.json's object."""
        return asdict(self)


def k_max_of(summary: dict) -> int | None:
    """A summary's K maximum, also from a summary written before the field was named k_max (then `k`)."""
    return summary.get("k_max", summary.get("k"))


def keys(**flags: bool) -> tuple[str, ...]:
    """The summary fields whose metadata has these flags, in the record's order: keys(interval=True)."""
    return tuple(f.name for f in fields(RunSummary) if all(f.metadata[flag] == want for flag, want in flags.items()))


def interval_columns(summary: dict) -> dict:
    """A summary's headline intervals as scalar columns `METRIC_ci95_lo`, `_hi` (None where it has none)
    and `METRIC_ci95_note` (why it has none, where the summary says)."""
    columns, notes = {}, summary.get("interval_notes") or {}
    for name in keys(interval=True):
        columns[f"{name}_ci95_lo"], columns[f"{name}_ci95_hi"] = summary.get(f"{name}_ci95") or (None, None)
        columns[f"{name}_ci95_note"] = notes.get(name)
    return columns


@dataclass
class RunFacts:
    """What a run knows besides its round and batch tables; `summarize` puts all of it in the summary."""
    k_max: int  # the draft's traits.k_max (0: never asked)
    batches_by_category: bool = True  # batches never mix categories: each category's speedup is timed apart
    profile: Profile | None = None  # this machine's costs, which the prediction is priced with
    draft_profile: str = ""  # the draft's entry in the profile
    draft: str | None = None  # the draft's config name
    target: str | None = None
    k_policy: str | None = None  # fixed, auto or heuristic
    n_prompts: int | None = None
    vocab_overlap: float | None = None
    runtime: dict | None = None  # the runtime's settings and counters
    timing: dict | None = None  # what the timing passes did (study/run.time_again)
    greedy_answers: list[dict] | None = None  # greedy runs: each prompt's answer row (identical, divergence)


def summarize(rounds: pd.DataFrame, batches: pd.DataFrame, facts: RunFacts) -> RunSummary:
    """One run's summary, with 95% intervals (specexp.study.intervals): ``rounds`` is what the first pass
    decoded, ``batches`` every timing (repeats included), ``facts`` the rest."""
    k, profile, draft = facts.k_max, facts.profile, facts.draft_profile
    spec, ar = metrics.arms(rounds)
    first_pass = batches[batches["repeat"] == 0]  # what the rounds decoded
    first_spec, first_ar = metrics.arms(first_pass)
    per_round = ["batch", "round"]
    spec_rounds = spec.drop_duplicates(per_round)  # round timings, once per batch round
    ar_rounds = ar.drop_duplicates(per_round)
    ar_step_s = ar_rounds["target_s"].mean()  # one target pass over one token
    drafted_positions = spec_rounds["k_round"].sum()
    drafted_rounds = spec_rounds[spec_rounds["k_chosen"] > 0]
    c = (metrics.safe_ratio(spec_rounds["draft_s"].sum() / max(drafted_positions, 1), ar_step_s)
         if drafted_positions else None)
    run = arm_metrics(rounds, batches)
    mean_k = float(spec_rounds["k_chosen"].mean()) if len(spec_rounds) else float(k)
    predicted = {}
    never_drafted = not spec_rounds["k_chosen"].any()
    if profile is not None and (draft in profile.drafts or never_drafted) and len(spec) and len(ar):
        predicted = cost_model.predict_run(spec, ar, first_pass, k, profile, draft) | {"profile": profile.path}
    paired = intervals.paired_timings(batches)
    acceptance_cis, speedup_ci = intervals.acceptance_intervals(spec, k), intervals.speedup_interval(paired)
    notes = acceptance_cis.pop("interval_notes") | ({"speedup": speedup_ci["speedup_note"]}
                                                    if speedup_ci["speedup_note"] else {})
    accepted = spec["accepted"].to_numpy()
    categories = sorted(c for c in rounds["category"].dropna().unique())
    return RunSummary(
        **asdict(run),
        **acceptance_cis,
        speedup_ci95=speedup_ci["speedup_ci95"],
        interval_notes=notes,
        interval_units={"prompts": int(spec["prompt_id"].nunique()), "batches": int(paired["batch"].nunique())},
        speedup_by_first_arm={first: intervals.paired_speedup(rows) for first, rows in paired.groupby("first")}
        if "first" in paired else None,
        acceptance_curve=metrics.acceptance_curve(metrics.positions(spec), accepted, k),
        accepted_length_histogram=metrics.accepted_length_histogram(accepted, k),
        nodes_per_pass=float(spec["proposed"].mean()) if len(spec) else None,
        accepted_per_pass=float(accepted.mean()) if len(spec) else None,
        k_max=k,
        mean_k=mean_k,
        cost_ratio_c=c,
        verify_cost_ratio=metrics.safe_ratio(spec_rounds["target_s"].mean(), ar_step_s),
        **predicted,
        realized_over_predicted=metrics.safe_ratio(run.speedup, predicted["predicted_speedup"])
        if run.speedup and predicted.get("predicted_speedup") else None,
        predicted_speedup_iid=metrics.predicted_speedup(run.alpha, mean_k, c),
        time_split=time_split(spec_rounds, first_spec),
        reencode_ms_per_round=1e3 * float(drafted_rounds["reencode_s"].mean()) if len(drafted_rounds) else None,
        rounds_spec=int(len(spec_rounds)),
        rounds_ar=int(len(ar_rounds)),
        tokens_spec=int(first_spec["tokens"].sum()),
        tokens_ar=int(first_ar["tokens"].sum()),
        per_category={cat: arm_metrics(rounds[rounds["category"] == cat],
                                       batches[batches["category"] == cat] if facts.batches_by_category else None)
                      for cat in categories} or None,
        timing=facts.timing,
        k_policy=facts.k_policy,
        draft_profile=facts.draft_profile,
        # greedy_match is only defined under greedy decoding, where it is 1.0 in float32; in bf16 the arms'
        # pass shapes may round a near-tie apart (greedy_divergences says where, by how many rounding steps).
        greedy_match=float(np.mean([a["identical"] for a in facts.greedy_answers])) if facts.greedy_answers else None,
        greedy_divergences=[{"prompt_id": a["prompt_id"], **a["divergence"]} for a in facts.greedy_answers
                            if a.get("divergence")] if facts.greedy_answers is not None else None,
        n_prompts=facts.n_prompts,
        target=facts.target,
        draft=facts.draft,
        vocab_overlap=facts.vocab_overlap,
        runtime=facts.runtime,
    )


def time_split(spec_rounds: pd.DataFrame, first_spec: pd.DataFrame) -> dict[str, float]:
    """Seconds of the speculative run by part: its rounds' (once per batch round) and its first pass's prefill."""
    return {
        "draft": float(spec_rounds["draft_s"].sum()),
        # of it: re-encoding text between the two tokenizers (a cross-vocabulary draft; else 0)
        "draft_reencode": float(spec_rounds["reencode_s"].sum()),
        "target": float(spec_rounds["target_s"].sum()),
        "verify": float(spec_rounds["verify_s"].sum()),  # verify + commit + rewind bookkeeping
        "prefill": float(first_spec["prefill_s"].sum()),
    }
