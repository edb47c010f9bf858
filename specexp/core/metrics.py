"""The metrics of a study, each defined once, next to the code that computes it.

Inputs are per-(prompt, round) arrays of the speculative run, restricted to rounds in
which the prompt was still generating:
  proposed  draft tokens put to the target that round (a token tree's nodes)
  depth     draft positions the proposal reaches (a chain's: proposed; a tree's: its depth)
  accepted  of those, accepted by the rule (an accepted prefix; of a tree, the accepted path)
  emitted   tokens committed that round (accepted + one resampled/bonus token, cut at EOS/limit)
"""

import math

import numpy as np


def position_counts(proposed: np.ndarray, accepted: np.ndarray, active: np.ndarray | None,
                    k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row and draft position 1..k_max, whether the rule looked at it (proposed, every earlier
    one accepted) and whether it accepted it [B, k_max] each; rows out of the round (``active``
    False) count nothing, and None counts every row."""
    if active is None:
        active = np.ones(len(proposed), dtype=bool)
    position = np.arange(k_max)  # 0-based: position i + 1
    reached = (position < proposed[:, None]) & (position <= accepted[:, None]) & active[:, None]
    took = (position < accepted[:, None]) & active[:, None]
    return reached, took


def arms(table):
    """A rounds or batches table (study/run.py's) split by arm: (speculative rows, AR rows)."""
    return table[table["mode"] == "spec"], table[table["mode"] == "ar"]


def acceptance_curve(proposed: np.ndarray, accepted: np.ndarray, k: int) -> list[float | None]:
    """P(draft position i accepted | positions < i accepted), i = 1..k.

    Among rounds that proposed at least i tokens and accepted the first i-1, the fraction
    that accepted the i-th too. None where no round reached position i.
    """
    reached, took = position_counts(np.asarray(proposed), np.asarray(accepted), None, k)
    n_reached, n_took = reached.sum(0), took.sum(0)  # [k] each
    return [float(n_took[i] / n_reached[i]) if n_reached[i] else None for i in range(k)]


def alpha(proposed: np.ndarray, accepted: np.ndarray) -> float | None:
    """Acceptance rate alpha: accepted draft tokens / draft tokens the rule looked at.

    The rule looks at the accepted prefix and the first rejected token (if any), so this is
    the maximum-likelihood per-token acceptance probability of Leviathan et al.'s i.i.d.
    model, the alpha their speedup formula takes.
    """
    looked = looked_at(proposed, accepted).sum()
    return float(accepted.sum() / looked) if looked else None


def looked_at(proposed: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """Draft tokens the rule looked at per round: the accepted prefix and the first rejected one."""
    return np.minimum(accepted + 1, proposed)


def positions(rounds) -> np.ndarray:
    """A round table's draft positions per (prompt, round): its tree depth, or for tables written
    before trees, the tokens proposed (the same for a chain)."""
    return (rounds["depth"] if "depth" in rounds else rounds["proposed"]).to_numpy()


def accepted_length_histogram(accepted: np.ndarray, k: int) -> list[int]:
    """How many (prompt, round)s accepted 0, 1, ..., k draft tokens."""
    return np.bincount(np.asarray(accepted, dtype=int), minlength=k + 1)[: k + 1].tolist()


def drafted_acceptance_rate(proposed: np.ndarray, accepted: np.ndarray) -> float | None:
    """Accepted draft tokens / all draft tokens proposed (vLLM's "draft acceptance rate")."""
    total = proposed.sum()
    return float(accepted.sum() / total) if total else None


def tau(emitted: np.ndarray) -> float | None:
    """Mean accepted length tau: tokens committed per target pass (AR decoding has tau = 1)."""
    return float(emitted.mean()) if len(emitted) else None


def expected_tokens_per_round(a, k):
    """E[tokens per round] = (1 - a^(k+1)) / (1 - a) under i.i.d. acceptance a (floats or arrays)."""
    a_arr, k_arr = np.asarray(a, dtype=float), np.asarray(k, dtype=float)
    tokens = np.where(a_arr >= 1.0, k_arr + 1, (1 - a_arr ** (k_arr + 1)) / np.maximum(1 - a_arr, 1e-12))
    return float(tokens) if tokens.ndim == 0 else tokens


def predicted_speedup(a: float | None, k: int, c: float | None) -> float | None:
    """Leviathan et al.'s speedup (1 - a^(k+1)) / ((1 - a)(k c + 1)), a = alpha, c = cost ratio.

    It prices a verify pass over k+1 tokens like one AR step; ``verify_cost_ratio`` says how
    far that holds on the hardware at hand.
    """
    if a is None or c is None or math.isnan(c):
        return None
    return expected_tokens_per_round(a, k) / (k * c + 1)


def safe_ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def tokens_per_s(batches) -> float | None:
    """One arm's throughput over its batch timings (study/run.py's batches table): tokens emitted per
    second of whole decodes, prefill included."""
    return safe_ratio(batches["tokens"].sum(), batches["total_s"].sum())


def slot_counts(n_proposed: np.ndarray, path: np.ndarray, active: np.ndarray, n_slots: int) -> tuple[np.ndarray, ...]:
    """Summed over the active rows, per slot 0..n_slots-1: whether it was in the row's tree
    (n_proposed [B]) and whether it was on the accepted path (path [B, D] node indices, -1 after)."""
    reached = (np.arange(n_slots)[None, :] < n_proposed[active][:, None]).sum(0)
    on_path = path[active]
    accepted = np.bincount(on_path[(on_path >= 0) & (on_path < n_slots)], minlength=n_slots)
    return reached.astype(float), accepted.astype(float)
