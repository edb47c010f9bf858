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


def acceptance_curve(proposed: np.ndarray, accepted: np.ndarray, k: int) -> list[float | None]:
    """P(draft position i accepted | positions < i accepted), i = 1..k.

    Among rounds that proposed at least i tokens and accepted the first i-1, the fraction
    that accepted the i-th too. None where no round reached position i.
    """
    curve = []
    for i in range(1, k + 1):
        reached = (proposed >= i) & (accepted >= i - 1)
        curve.append(float((accepted[reached] >= i).mean()) if reached.any() else None)
    return curve


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
