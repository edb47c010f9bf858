"""Metric definitions on hand-checked cases."""

import numpy as np
import pandas as pd
import pytest

from specexp.core import metrics
from specexp.study.run import summarize


def test_acceptance_curve_is_conditional_per_position():
    proposed = np.array([4, 4, 4, 4, 2])
    accepted = np.array([0, 1, 4, 2, 2])
    curve = metrics.acceptance_curve(proposed, accepted, 4)
    # pos 1: all 5 reached, 4 accepted; pos 2: 4 reached (acc>=1), 3 accepted (1 stops);
    # pos 3: rounds with proposed>=3 and acc>=2: [4, 2] -> 1 of 2; pos 4: [4] -> 1 of 1.
    assert curve == [4 / 5, 3 / 4, 1 / 2, 1.0]
    assert metrics.acceptance_curve(np.array([1]), np.array([0]), 3) == [0.0, None, None]


def test_alpha_counts_tokens_the_rule_looked_at():
    proposed = np.array([4, 4, 2, 0])
    accepted = np.array([1, 4, 2, 0])
    # looked at: 2 (1 accepted + 1 rejected), 4, 2, 0 -> 7 accepted of 8.
    assert metrics.alpha(proposed, accepted) == 7 / 8
    assert metrics.drafted_acceptance_rate(proposed, accepted) == 7 / 10
    assert metrics.alpha(np.array([0]), np.array([0])) is None


def test_predicted_speedup_formula():
    assert metrics.predicted_speedup(0.0, 4, 0.0) == 1.0
    assert metrics.predicted_speedup(1.0, 4, 0.0) == 5.0
    assert metrics.predicted_speedup(1.0, 4, 0.25) == 2.5
    a, k, c = 0.8, 4, 0.1
    assert metrics.predicted_speedup(a, k, c) == pytest.approx((1 - a**5) / ((1 - a) * (k * c + 1)))
    assert metrics.predicted_speedup(None, 4, 0.1) is None


def test_summary_of_a_hand_made_run():
    rounds = pd.DataFrame({
        "mode": ["spec", "spec", "spec", "ar", "ar", "ar", "ar", "ar", "ar"],
        "batch": 0, "prompt_id": "p", "category": "c", "round": [0, 1, 2, 0, 1, 2, 3, 4, 5],
        "k": [2, 2, 2, 0, 0, 0, 0, 0, 0], "k_round": [2, 2, 2, 0, 0, 0, 0, 0, 0],
        "proposed": [2, 2, 2, 0, 0, 0, 0, 0, 0], "accepted": [2, 0, 1, 0, 0, 0, 0, 0, 0],
        "emitted": [3, 1, 2, 1, 1, 1, 1, 1, 1],
        "draft_s": [0.01] * 3 + [0.0] * 6, "target_s": [0.2] * 3 + [0.1] * 6, "verify_s": [0.01] * 9,
    })
    batches = pd.DataFrame({"mode": ["spec", "ar"], "batch": 0, "category": "c", "tokens": [6, 6],
                            "total_s": [1.0, 1.5], "prefill_s": [0.1, 0.1]})
    s = summarize(rounds, batches, k=2)
    assert s["alpha"] == 3 / 5 and s["tau"] == 2.0
    assert s["acceptance_curve"] == [2 / 3, 1 / 2]
    assert s["speedup"] == pytest.approx(1.5)
    assert s["cost_ratio_c"] == pytest.approx(0.005 / 0.1)
    assert s["verify_cost_ratio"] == pytest.approx(2.0)
    assert s["predicted_speedup_iid"] == pytest.approx(metrics.predicted_speedup(0.6, 2, 0.05))
    assert s["predicted_speedup"] is None and s["realized_over_predicted"] is None  # no hardware profile given
    assert s["per_category"]["c"]["speedup"] == pytest.approx(1.5)
