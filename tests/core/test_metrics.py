"""Metric definitions on hand-checked cases."""

import numpy as np
import pandas as pd
import pytest

from specexp.core import metrics
from specexp.study.summary import RunFacts, summarize


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
        "k": [2, 2, 2, 0, 0, 0, 0, 0, 0], "k_chosen": [2, 2, 2, 0, 0, 0, 0, 0, 0],
        "k_round": [2, 2, 2, 0, 0, 0, 0, 0, 0],
        "proposed": [2, 2, 2, 0, 0, 0, 0, 0, 0], "accepted": [2, 0, 1, 0, 0, 0, 0, 0, 0],
        "emitted": [3, 1, 2, 1, 1, 1, 1, 1, 1],
        "draft_s": [0.01] * 3 + [0.0] * 6, "reencode_s": 0.0, "target_s": [0.2] * 3 + [0.1] * 6, "verify_s": [0.01] * 9,
    })
    batches = pd.DataFrame({"mode": ["spec", "ar"], "batch": 0, "repeat": 0, "category": "c", "tokens": [6, 6],
                            "total_s": [1.0, 1.5], "prefill_s": [0.1, 0.1]})
    s = summarize(rounds, batches, RunFacts(k_max=2)).to_dict()
    assert s["alpha"] == 3 / 5 and s["tau"] == 2.0
    assert s["acceptance_curve"] == [2 / 3, 1 / 2]
    assert s["speedup"] == pytest.approx(1.5)
    assert s["cost_ratio_c"] == pytest.approx(0.005 / 0.1)
    assert s["verify_cost_ratio"] == pytest.approx(2.0)
    assert s["predicted_speedup_iid"] == pytest.approx(metrics.predicted_speedup(0.6, 2, 0.05))
    assert s["predicted_speedup"] is None and s["realized_over_predicted"] is None  # no hardware profile given
    assert s["per_category"]["c"]["speedup"] == pytest.approx(1.5)


def two_category_run() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two prompts (categories a and b), each its own batch: rounds and batch timings of both arms."""
    rows = []
    for batch, (prompt, category, accepted) in enumerate([("p", "a", [2, 0, 1]), ("q", "b", [1, 1])]):
        for r, acc in enumerate(accepted):
            rows.append({"mode": "spec", "batch": batch, "prompt_id": prompt, "category": category, "round": r, "k": 2,
                         "k_chosen": 2, "k_round": 2, "proposed": 2, "accepted": acc, "emitted": acc + 1,
                         "draft_s": 0.02, "reencode_s": 0.0, "target_s": 0.2, "verify_s": 0.01})
        for r in range(sum(accepted) + len(accepted)):
            rows.append({"mode": "ar", "batch": batch, "prompt_id": prompt, "category": category, "round": r, "k": 0,
                         "k_chosen": 0, "k_round": 0, "proposed": 0, "accepted": 0, "emitted": 1, "draft_s": 0.0,
                         "reencode_s": 0.0, "target_s": 0.1, "verify_s": 0.01})
    batches = pd.DataFrame({"mode": ["spec", "ar", "spec", "ar"], "batch": [0, 0, 1, 1], "repeat": 0,
                            "category": ["a", "a", "b", "b"],
                            "tokens": [6, 6, 4, 4], "total_s": [1.0, 1.5, 0.8, 0.9], "prefill_s": 0.1})
    return pd.DataFrame(rows), batches


def test_one_arm_metrics_measures_the_run_and_each_category():
    from dataclasses import asdict

    from specexp.study.summary import ArmMetrics, arm_metrics

    rounds, batches = two_category_run()
    s = summarize(rounds, batches, RunFacts(k_max=2)).to_dict()
    run = arm_metrics(rounds, batches)
    assert {name: s[name] for name in asdict(run)} == asdict(run)
    assert run.alpha == 5 / 9 and run.tau == 10 / 5 and run.speedup == pytest.approx((10 / 1.8) / (10 / 2.4))
    a = s["per_category"]["a"]
    assert a == asdict(arm_metrics(rounds[rounds["category"] == "a"], batches[batches["category"] == "a"]))
    assert set(a) == {f for f in asdict(ArmMetrics())} and a["alpha"] == 3 / 5 and a["speedup"] == pytest.approx(1.5)
    mixed = summarize(rounds, batches, RunFacts(k_max=2, batches_by_category=False)).to_dict()["per_category"]["b"]
    assert mixed["speedup"] is None and mixed["alpha"] == 2 / 4  # batches that mix categories time no category apart


def test_each_prompts_row_of_the_figures_is_arm_metrics_of_its_rounds(tmp_path):
    from specexp.reporting.figure_tables import per_prompt_table
    from specexp.study.summary import arm_metrics

    rounds, _ = two_category_run()
    rounds.to_parquet(tmp_path / "rounds.parquet")
    jobs = pd.DataFrame([{"path": str(tmp_path), "draft": "d", "k": 2, "temperature": 0.0, "batch_size": 1}])
    table = per_prompt_table(jobs).set_index("prompt_id")
    p = rounds[rounds["prompt_id"] == "p"]
    decode = p.assign(tokens=p["emitted"], total_s=p["draft_s"] + p["target_s"] + p["verify_s"])
    expected = arm_metrics(p, decode.groupby("mode", as_index=False)[["tokens", "total_s"]].sum())
    assert table.loc["p", "alpha"] == expected.alpha == 3 / 5 and table.loc["p", "tau"] == expected.tau
    assert table.loc["p", "speedup"] == pytest.approx((6 / 0.69) / (6 / 0.66)) == expected.speedup


def test_the_key_lists_of_the_table_wandb_and_the_report_are_the_summarys_metadata():
    from dataclasses import fields

    from specexp.reporting import job_table as collect
    from specexp.study import tracking
    from specexp.study.summary import RunSummary, keys

    schema = {f.name: f for f in fields(RunSummary)}
    assert all(f.metadata["doc"] for f in schema.values())
    assert keys(interval=True) == ("alpha", "tau", "speedup")
    assert all(f"{name}_ci95" in schema for name in keys(interval=True))  # an interval is a field of its own
    assert collect.METRICS == keys(collected=True) and set(keys(headline=True)) <= set(keys(collected=True))
    assert tracking.HEADLINE_KEYS == keys(headline=True)
    assert {"speedup", "alpha", "tau", "cost_ratio_c", "predicted_speedup"} <= set(keys(headline=True))
