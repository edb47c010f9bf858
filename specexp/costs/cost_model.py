"""The calibrated cost model: what a round of speculative decoding yields and what it costs.

Tokens come from the measured per-position acceptance, not an i.i.d. alpha: a round that
proposes p tokens commits 1 + sum_{i<=p} prod_{j<=i} a_j of them in expectation, where a_j is
P(position j accepted | positions < j accepted) (`metrics.acceptance_curve`). Seconds come from
the machine's hardware profile (`specexp.costs.hardware_profile`): the target's pass over n tokens at the
context length of the round T(n, L), the draft's cost of proposing K tokens, the engine's
bookkeeping per round, and the prompt pass. The speedup it predicts is AR seconds per token
over speculative seconds per token, prompt passes included, as the study measures it.
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd

from specexp.core.metrics import acceptance_curve, arms, expected_tokens_per_round, position_counts


def filled_curve(curve: Sequence[float | None], k: int) -> np.ndarray:
    """The acceptance curve at positions 1..k [k]: a position no round reached takes the last
    measured value (later positions of a draft are accepted at least as often as earlier ones in
    every study we ran); with nothing measured, 0."""
    filled, last = [], next((a for a in curve if a is not None), 0.0)
    for i in range(k):
        last = curve[i] if i < len(curve) and curve[i] is not None else last
        filled.append(last)
    return np.asarray(filled, dtype=float)


def acceptance_by_length(proposed: np.ndarray, accepted: np.ndarray, k: int, weight: float = 4.0) -> np.ndarray:
    """Per-position acceptance among rounds that proposed exactly p tokens [k+1, k] (row p = 0..k).

    A draft that proposes few tokens when unsure (prompt lookup after a short match, a confidence
    threshold) is accepted less in those rounds, so one curve over all rounds under-counts the
    long ones. Each row is shrunk toward the pooled curve by ``weight`` pseudo-rounds, so a rare
    length borrows from the rest.
    """
    proposed, accepted = np.asarray(proposed), np.asarray(accepted)
    pooled = filled_curve(acceptance_curve(proposed, accepted, k), k)
    table = np.tile(pooled, (k + 1, 1))
    for p in np.unique(proposed[proposed > 0]):
        rows = proposed == p
        reached, took = position_counts(proposed[rows], accepted[rows], None, int(p))  # [n, p] each
        table[p, :p] = (took.sum(0) + weight * pooled[:p]) / (reached.sum(0) + weight)
    return table


def expected_emitted(table: np.ndarray, proposed: np.ndarray, limit: int | None = None) -> np.ndarray:
    """Expected tokens committed by rounds whose draft proposed these many tokens (any shape),
    kept to the first ``limit`` of them: 1 + sum_{i <= min(p, limit)} prod_{j <= i} a_{p, j}."""
    proposed = np.asarray(proposed, dtype=int)
    run = np.cumprod(table, axis=1)  # [k+1, k]: P(first i accepted | p proposed)
    cumulative = np.concatenate([np.zeros((len(table), 1)), np.cumsum(run, axis=1)], axis=1)  # [k+1, k+1]
    kept = proposed if limit is None else np.minimum(proposed, limit)
    return 1.0 + cumulative[proposed, kept]


def speedup(ar_seconds: float, spec_seconds: float, ar_tokens: float, spec_tokens: float) -> float:
    """Tokens per second of the speculative run over the AR run's."""
    return float((spec_tokens / spec_seconds) / (ar_tokens / ar_seconds))


def predict_run(spec: pd.DataFrame, ar: pd.DataFrame, batches: pd.DataFrame, k: int, profile, draft: str,
                limit: int | None = None) -> dict:
    """The speedup the cost model predicts for a finished run (or, with ``limit``, for the same
    draft kept to its first ``limit`` tokens a round: the run at another K), and what it prices.

    spec, ar: the run's round tables (one row per active prompt and round, with the round's
    `k_chosen`, `k_round` and `context`); batches: one row per (mode, batch) with `tokens` and
    `prompt_length`. A speculative round costs the draft's seconds for the K it was asked for,
    T(k_round + 1, context) and the engine's bookkeeping, and yields what the per-position
    acceptance (by proposal length) expects of the tokens its rows proposed. An AR round costs
    T(1, context) and the bookkeeping. Prompt passes are priced at each batch's prompt length, and
    the draft's once-a-batch cost (its fill) for each batch in which it proposed. The tokens to
    generate are the run's own.
    """
    spec_rounds, ar_rounds = spec.drop_duplicates(["batch", "round"]), ar.drop_duplicates(["batch", "round"])
    cap = np.inf if limit is None else limit
    asked = np.minimum(spec_rounds["k_chosen"].to_numpy(), cap).astype(int)
    passes = np.minimum(spec_rounds["k_round"].to_numpy(), cap).astype(int) + 1
    contexts = spec_rounds["context"].to_numpy()
    draft_s = float(profile.draft_s(draft, asked).sum()) if asked.any() else 0.0  # a draft never asked costs nothing
    target_s = float(sum(profile.pass_s(n, c, draft if a else None) for n, c, a in zip(passes, contexts, asked,
                                                                                        strict=True)))
    overhead_s = profile.overhead_s * len(spec_rounds)
    table = acceptance_by_length(spec["proposed"].to_numpy(), spec["accepted"].to_numpy(), k)
    expected = float(expected_emitted(table, spec["proposed"].to_numpy(), limit).sum())
    spec_b, ar_b = arms(batches)
    prefill_ar = float(sum(profile.prefill(p) for p in ar_b["prompt_length"]))
    # a draft never asked costs nothing
    drafting_batches = spec_rounds.loc[spec_rounds["k_chosen"] > 0, "batch"].nunique()
    prefill_spec = float(sum(profile.prefill(p) for p in spec_b["prompt_length"]))
    prefill_spec += profile.reset_s(draft) * drafting_batches if drafting_batches else 0.0
    # Tokens after each row's first (which the prompt pass yields), at the rate the model expects.
    spec_round_tokens = float(spec["emitted"].sum())
    spec_s = prefill_spec + spec_round_tokens * (draft_s + target_s + overhead_s) / expected
    ar_s = (prefill_ar + float(sum(profile.pass_s(1, c) for c in ar_rounds["context"]))
            + profile.overhead_s * len(ar_rounds))
    return {
        "predicted_speedup": speedup(ar_s, spec_s, float(ar_b["tokens"].sum()), float(spec_b["tokens"].sum())),
        "predicted_tokens_per_round": expected / len(spec) if len(spec) else None,
        "predicted_time_split": {"draft": draft_s, "target": target_s, "verify": overhead_s, "prefill": prefill_spec,
                                 "ar_total": ar_s, "spec_total": spec_s},
    }


def predict_from_curve(curve: Sequence[float | None], k: int, profile, draft: str, context: float,
                       prompt_length: float, new_tokens: int) -> dict:
    """What a draft proposing k tokens every round with this acceptance curve should yield, before
    any decoding: tokens per round 1 + sum_{i<=k} prod_{j<=i} a_j, each round's target pass
    T(k + 1, context), priced by price_rounds. k = 0 (a K policy may decline to draft) costs exactly
    AR. The pairing replay prices each round at its own proposal length instead (round_yields)."""
    run = np.cumprod(filled_curve(curve, k))  # [k]: P(first i accepted)
    tokens_per_round = 1.0 + float(run.sum())
    # at k = 0 the round is the target's plain pass (the engine runs no shared early-exit pass then)
    target_s = float(profile.pass_s(k + 1, context, draft if k else None))
    return {"predicted_tau": tokens_per_round,
            "predicted_speedup": price_rounds(tokens_per_round, target_s, k, profile, draft, context, prompt_length,
                                              new_tokens)}


def equivalent_alpha(tokens_per_round: float, k: float) -> float:
    """The i.i.d. acceptance rate whose (1 - a^(k+1)) / (1 - a) equals a draft's tokens per round
    at its K (bisection): where the draft sits on an alpha axis priced by the same model."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_round(mid, k) < tokens_per_round else (low, mid)
    return (low + high) / 2


def best_speedup_on(profile_ratios: np.ndarray, overhead_ratio: float, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """max over K of a draft's speedup with i.i.d. acceptance a and cost c per drafted token (in
    AR steps), on hardware whose pass over n tokens costs profile_ratios[n-1] AR passes (and the
    bookkeeping overhead_ratio): the iso-speedup surface of the cost/quality plane."""
    a, c = np.broadcast_arrays(np.asarray(a, float), np.asarray(c, float))
    ks = np.arange(1, len(profile_ratios))[:, None]  # [K, 1]
    flat_a, flat_c = a.ravel()[None, :], c.ravel()[None, :]
    spec_round = ks * flat_c + np.asarray(profile_ratios)[ks] + overhead_ratio  # [K, points]
    return (expected_tokens_per_round(flat_a, ks) * (1 + overhead_ratio) / spec_round).max(0).reshape(a.shape)


def round_yields(runs: Sequence[np.ndarray], proposed: np.ndarray, k: int, profile, draft: str,
                 context: float) -> tuple[np.ndarray, np.ndarray]:
    """Each replayed round (specexp.study.replay) as the study would run it at K = k: it proposes
    min(n_r, k) tokens (n_r: what it proposed at the replay's K; a round that proposed nothing still
    costs a round) and commits 1 + sum_{i <= min(n_r, k)} P(depths 1..i accepted) in expectation, its
    target pass over min(n_r, k) + 1 tokens. Returns tokens [R] and target seconds [R]."""
    asked = np.minimum(np.asarray(proposed, dtype=int), k)  # [R]
    tokens = 1.0 + np.array([float(run[:m].sum()) for run, m in zip(runs, asked, strict=True)])
    target_s = np.asarray(profile.pass_s(asked + 1, context, draft if k else None), dtype=float) * np.ones(len(asked))
    return tokens, target_s


def price_rounds(tokens_per_round: float, target_s_per_round: float, k: int, profile, draft: str, context: float,
                 prompt_length: float, new_tokens: int) -> float:
    """The speedup of rounds that commit ``tokens_per_round`` and pass the target for
    ``target_s_per_round`` on average, each with the draft's seconds for k and the bookkeeping, against
    AR's T(1, context) and bookkeeping per token; one prompt pass each (and the draft's fill) for a
    prompt of ``prompt_length`` tokens that generates ``new_tokens``. k = 0 costs exactly AR."""
    round_s = float(profile.draft_s(draft, k)) + target_s_per_round + profile.overhead_s
    ar_step_s = float(profile.pass_s(1, context)) + profile.overhead_s
    prefill = profile.prefill(prompt_length)
    fill = profile.reset_s(draft) if k else 0.0  # a draft never asked costs nothing
    spec_s = prefill + fill + (new_tokens - 1) * round_s / tokens_per_round
    return (prefill + (new_tokens - 1) * ar_step_s) / spec_s
