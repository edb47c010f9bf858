"""Paper figures: the analytical model, every plotting function on synthetic tables (checked
through their artists), and the figures command on empty and partial folders."""

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402

from specexp.core import metrics  # noqa: E402
from specexp.costs.cost_model import best_speedup_on  # noqa: E402
from specexp.reporting import plots  # noqa: E402
from specexp.reporting.paper_figures import make_figures  # noqa: E402
from tests.commands import run_module

DRAFTS = ("prompt_lookup", "distilled")


def test_analytical_curve_matches_the_formula():
    for a, k, c in [(0.6, 3, 0.1), (0.0, 2, 0.05), (0.95, 8, 0.02), (1.0, 4, 0.1)]:
        assert plots.analytical_speedup(a, np.array([k]), c)[0] == pytest.approx(metrics.predicted_speedup(a, k, c))
    assert plots.analytical_speedup(0.5, np.array([1]), 0.0)[0] == pytest.approx(1.5)  # 1 + a tokens per round


def test_optimal_k_on_hand_checked_cases():
    # a = 0.8, c = 0.1: S(5) = 3.689/1.5 = 2.460, S(6) = 3.951/1.6 = 2.470, S(7) = 4.161/1.7 = 2.448
    assert plots.optimal_k(0.8, 0.1) == 6
    assert plots.optimal_k(0.0, 0.1) == 1  # nothing is ever accepted: draft as little as possible
    assert plots.optimal_k(1.0, 0.0, k_max=12) == 12  # free, always right: draft as much as allowed


def test_the_plane_on_flat_hardware_is_leviathans_and_longer_passes_cost():
    grid_a, grid_c = np.array([[0.8, 0.3]]), np.array([[0.1, 0.5]])
    expected = [max(metrics.predicted_speedup(a, k, c) for k in range(1, 33)) for a, c in [(0.8, 0.1), (0.3, 0.5)]]
    np.testing.assert_allclose(best_speedup_on(np.ones(33), 0.0, grid_a, grid_c)[0], expected)
    # Every extra token in the pass costs 10% of a step: a = 0.8, c = 0 gives (1 - 0.8^(K+1)) / (0.2 (1 + 0.1 K)):
    # K = 5: 3.689 / 1.5 = 2.459, K = 6: 3.951 / 1.6 = 2.470, K = 7: 4.161 / 1.7 = 2.448 (flat: 5.0 at K = 32)
    ratios = 1 + 0.1 * np.arange(33)
    assert best_speedup_on(ratios, 0.0, np.array(0.8), np.array(0.0)) == pytest.approx((1 - 0.8**7) / 0.2 / 1.6)


@pytest.fixture
def synthetic():
    rng = np.random.default_rng(0)
    jobs, prompts, positions = [], [], []
    for draft, a, c in [("prompt_lookup", 0.4, 0.01), ("distilled", 0.6, 0.1)]:
        for k in (1, 2, 4):
            for t in (0.0, 0.7):
                speedup = metrics.predicted_speedup(a, k, c) * 0.8
                jobs.append({"draft": draft, "k": k, "temperature": t, "batch_size": 1 + k // 2, "alpha": a,
                             "cost_ratio_c": c, "speedup": speedup, "tau": 1 + a * k / 2, "predicted_speedup":
                             metrics.predicted_speedup(a, k, c), "tau.writing": 1 + a, "tau.math": 1 + a / 2,
                             "tau.coding": 1 + a / 3})
                for p in range(6):
                    prompts.append({"draft": draft, "k": k, "prompt_id": p, "speedup": speedup + rng.normal(0, 0.05)})
                    positions += [{"draft": draft, "k": k, "prompt_id": p, "position": i, "acceptance":
                                   float(np.clip(a + rng.normal(0, 0.05), 0, 1))} for i in range(1, k + 1)]
    history = pd.DataFrame([{"objective": o, "step": s, "val/alpha": 0.3 + s / 1000 + (o == "tvd") * 0.05}
                            for o in ("forward_kl", "tvd") for s in (100, 200, 300)])
    return pd.DataFrame(jobs), pd.DataFrame(prompts), pd.DataFrame(positions), history


def legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_acceptance_curve_has_a_line_per_draft_with_intervals(synthetic):
    _, _, positions, _ = synthetic
    ax = plots.acceptance_curve(positions).axes[0]
    assert sorted(legend_labels(ax)) == sorted(DRAFTS)
    assert len(ax.collections) >= 2  # the confidence bands
    assert ax.get_ylim()[0] == 0 and ax.get_xlabel().startswith("draft position")


def test_speedup_vs_k_draws_points_the_cost_model_its_optimum_and_the_iid_curve(synthetic):
    jobs, prompts, _, _ = synthetic
    model = pd.DataFrame([{"draft": d, "k": k, "speedup": s} for d, curve in
                          [("prompt_lookup", [1.0, 1.1, 1.05]), ("distilled", [1.2, 1.1, 0.9])]
                          for k, s in zip((1, 2, 4), curve, strict=True)])
    ax = plots.speedup_vs_k(jobs, prompts, model, "a CPU").axes[0]
    stars = sorted((float(s.get_xdata()[0]), float(s.get_ydata()[0])) for s in ax.lines if s.get_marker() == "*")
    assert stars == [(1.0, 1.2), (2.0, 1.1)]  # each draft's best K under the cost model
    iid = [line for line in ax.lines if len(line.get_xdata()) == 200]
    assert len(iid) == 2 and all(line.get_linestyle() == "--" for line in iid)  # Leviathan's, dashed
    for curve in iid:  # passing through the formula at K = 2
        x, y = curve.get_xdata(), curve.get_ydata()
        ys = [metrics.predicted_speedup(a, 2, c) for a, c in [(0.4, 0.01), (0.6, 0.1)]]
        assert min(abs(np.interp(2, x, y) - v) for v in ys) < 1e-2
    assert "cost model (a CPU)" in legend_labels(ax) and "i.i.d. model (Leviathan)" in legend_labels(ax)


def test_cost_quality_plane_places_each_draft_at_c_alpha(synthetic):
    jobs, _, _, _ = synthetic
    ax = plots.cost_quality_plane(jobs).axes[0]
    points = {tuple(np.round(c.get_offsets()[0], 6)) for c in ax.collections if isinstance(c, PathCollection)}
    assert points == {(0.01, 0.4), (0.1, 0.6)}
    assert ax.get_xlabel().startswith("c") and "alpha" in ax.get_ylabel()
    labels = {t.get_text() for t in ax.texts}  # the iso-speedup contour labels
    assert {"1x", "1.5x", "2x"} <= labels
    assert "i.i.d." in ax.get_title()  # no profile: Leviathan's plane, and the title says so


def test_category_heatmap_annotates_every_cell(synthetic):
    jobs, _, _, _ = synthetic
    ax = plots.category_heatmap(jobs, "tau").axes[0]
    values = sorted(float(t.get_text()) for t in ax.texts)
    assert len(values) == 2 * 3
    assert values[-1] == pytest.approx(1.6) and values[0] == pytest.approx(1 + 0.4 / 3, abs=0.005)
    assert {t.get_text() for t in ax.get_xticklabels()} == {"writing", "math", "coding"}


@pytest.mark.parametrize("factor", ["temperature", "batch_size"])
def test_effect_plots_show_alpha_and_speedup(synthetic, factor):
    jobs, _, _, _ = synthetic
    fig = plots.effect_of(jobs, factor, factor)
    assert [ax.get_ylabel() for ax in fig.axes] == [r"$\alpha$", "speedup over AR"]
    assert sorted(legend_labels(fig.axes[1])) == sorted(DRAFTS)


def test_distillation_curves_one_line_per_objective(synthetic):
    *_, history = synthetic
    ax = plots.distillation_curves(history).axes[0]
    assert sorted(legend_labels(ax)) == ["forward_kl", "tvd"]
    lines = [line for line in ax.lines if len(line.get_xdata()) == 3]
    assert sorted(round(float(line.get_ydata()[-1]), 3) for line in lines) == [0.6, 0.65]


def test_headline_table_picks_each_drafts_best_k(synthetic):
    jobs, _, _, _ = synthetic
    table = plots.headline_table(jobs).set_index("draft")
    # Worked by hand from (1 - a^(K+1)) / ((1 - a)(K c + 1)):
    #   a = 0.4, c = 0.01: K = 1..5 -> 1.386, 1.529, 1.577, 1.586, 1.581: best measured K 4 (of 1, 2, 4), optimum 4
    #   a = 0.6, c = 0.1:  K = 1..4 -> 1.455, 1.633, 1.674, 1.647: best measured K 4 (of 1, 2, 4), optimum 3
    for draft, best, optimum in [("prompt_lookup", 4, 4), ("distilled", 4, 3)]:
        assert table.loc[draft, "K"] == best and table.loc[draft, "optimal K"] == optimum


def test_figures_command_explains_empty_and_partial_folders(tmp_path):
    empty = run_module("specexp.figures", str(tmp_path), timeout=120)
    assert empty.returncode == 2 and "nothing to plot" in empty.stderr and "Traceback" not in empty.stderr
    missing = run_module("specexp.figures", str(tmp_path / "nope"), timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    failed = tmp_path / "sweep" / "draft=x"  # a sweep whose only job failed
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "config.yaml").write_text("draft: {k: 4}\n")
    (failed / "error.json").write_text(json.dumps({"error": "boom"}))
    written, skipped = make_figures([tmp_path / "sweep"], tmp_path / "figs")
    assert written == [] and "no finished study jobs" in skipped["acceptance_curve"]
    assert "2 or more K" in skipped["speedup_vs_k"]


def test_wandb_jobs_maps_runs_to_the_job_table(monkeypatch):
    """The notebooks' W&B path (no network here): runs -> the same columns as local results."""
    import types

    import wandb

    runs = [types.SimpleNamespace(job_type="prompt_lookup",
                                  summary={"alpha": 0.4, "speedup": 1.1, "_step": 3, "name": "x"},
                                  config={"draft": {"k": 4}, "sampling": {"temperature": 0.0}, "batch_size": 1})]
    calls = []

    class FakeApi:
        def runs(self, project, filters=None):
            calls.append((project, filters))
            return runs

    monkeypatch.setattr(wandb, "Api", FakeApi)
    from specexp.reporting.figure_tables import wandb_jobs

    table = wandb_jobs("me/specexp", group="k_sweep")
    assert calls == [("me/specexp", {"group": "k_sweep"})]
    assert table.to_dict("records") == [{"draft": "prompt_lookup", "k": 4, "k_label": "4", "branches": 1,
                                         "temperature": 0.0, "batch_size": 1, "alpha": 0.4, "speedup": 1.1}]


def test_tree_budget_draws_tau_and_speedup_per_branching_with_the_models_prediction():
    jobs = pd.DataFrame([{"draft": draft, "k": k, "branches": b, "tau": 1 + 0.1 * k * b, "speedup": 1 + 0.01 * k,
                          "predicted_speedup": 1.02 + 0.01 * k}
                         for draft in DRAFTS for k in (2, 4, 8) for b in (1, 2)])
    fig = plots.tree_budget(jobs)
    tau_ax, speed_ax = fig.axes[:2]
    assert tau_ax.get_ylabel().startswith(r"$\tau$") and speed_ax.get_ylabel() == "speedup over AR"
    measured = [line for line in tau_ax.lines if len(line.get_xdata()) == 3]
    assert len(measured) == 4  # a line per (draft, branching)
    assert sorted(measured[0].get_xdata()) == [2, 4, 8]
    predicted = [line for line in speed_ax.lines if line.get_marker() == "+"]
    assert len(predicted) == 4 and "cost model (each job)" in legend_labels(speed_ax)
    np.testing.assert_allclose(sorted(np.concatenate([line.get_ydata() for line in predicted])),
                               sorted(jobs["predicted_speedup"]))


def test_jobs_with_intervals_get_error_bars_and_the_headline_says_them(synthetic):
    """Tables from studies with intervals (speedup_ci95_lo/hi): speedup_vs_k draws each job's own
    interval as an error bar (not a CI over prompts), and so do realized_vs_predicted and the
    headline table."""
    from matplotlib.container import ErrorbarContainer

    jobs, prompts, _, _ = synthetic
    jobs = jobs[jobs["temperature"] == 0.0].assign(speedup_ci95_lo=lambda t: t["speedup"] - 0.05,
                                                  speedup_ci95_hi=lambda t: t["speedup"] + 0.1)
    ax = plots.speedup_vs_k(jobs, prompts).axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one per draft
    segments = np.concatenate([bar.lines[2][0].get_segments() for bar in bars])  # [jobs, 2 ends, (x, y)]
    assert sorted(np.round(segments[:, 1, 1] - segments[:, 0, 1], 6)) == [0.15] * len(jobs)  # lo to hi
    ax = plots.realized_vs_predicted(jobs).axes[0]
    assert any(isinstance(c, ErrorbarContainer) for c in ax.containers)
    table = plots.headline_table(jobs).set_index("draft")
    best = jobs.loc[jobs.groupby("draft")["speedup"].idxmax()].set_index("draft")
    for draft in DRAFTS:
        lo, hi = best.loc[draft, "speedup_ci95_lo"], best.loc[draft, "speedup_ci95_hi"]
        assert table.loc[draft, "speedup 95% CI"] == f"[{lo:.3f}, {hi:.3f}]"


def test_every_registered_draft_and_its_variants_get_their_own_colour():
    from specexp.drafts.registry import draft_names

    registered = draft_names()
    assert {"eagle", "medusa", "oracle", "early_exit", "prompt_lookup"} <= set(registered)
    labels = registered + ["early_exit/trained/shared", "early_exit/untrained/naive", "my_new_draft"]
    palette = plots.draft_palette(labels)
    assert set(palette) == set(labels) and len(set(palette.values())) == len(labels)
    assert plots.draft_palette(["eagle"])["eagle"] == palette["eagle"]  # stable whatever else is in the figure
    declared = plots.draft_palette(["my_new_draft", "eagle"], {"my_new_draft": "#8000ff"})  # its card's colour
    assert declared["my_new_draft"] == (128 / 255, 0.0, 1.0) and declared["eagle"] == palette["eagle"]


def test_pairing_matrix_annotates_measured_intervals_predictions_and_leaves_skipped_pairs_blank():
    rows = []
    for target in ("default", "gemma3_270m"):
        for draft in ("prompt_lookup", "eagle", "smollm2_135m"):
            if (target, draft) in {("gemma3_270m", "eagle"), ("default", "smollm2_135m")}:
                continue  # skipped pairs: their drafts do not apply
            for temperature in (0.0, 0.7):
                speedup = 1.2 if draft == "prompt_lookup" else 0.6
                rows.append({"target": target, "draft": draft, "data": "mt_bench", "temperature": temperature,
                             "speedup": speedup, "speedup_ci95_lo": speedup - 0.1, "speedup_ci95_hi": speedup + 0.1,
                             "alpha": 0.5, "alpha_ci95_lo": 0.4, "alpha_ci95_hi": 0.6, "predicted_speedup": 1.0})
    jobs = pd.DataFrame(rows)
    fig = plots.pairing_matrix(jobs)
    speedup_ax, alpha_ax = fig.axes[0], fig.axes[1]  # setting 1: speedup, alpha; setting 2; then the colour bars
    assert speedup_ax.get_title() == "mt_bench, T = 0" and len(fig.axes) == 2 * 2 * 2
    texts = [t.get_text() for t in speedup_ax.texts if t.get_text()]
    assert len(texts) == 4 and "1.20\n[1.10, 1.30]\npred 1.00" in texts
    assert sorted(t.get_text() for t in alpha_ax.texts if t.get_text()) == ["0.50\n[0.40, 0.60]"] * 4
    assert {t.get_text() for t in speedup_ax.get_yticklabels()} == {"default", "gemma3_270m"}
    scatter = plots.pairing_scatter(jobs).axes[0]
    assert sum(len(c.get_offsets()) for c in scatter.collections if isinstance(c, PathCollection)) == len(jobs)
    assert any(line.get_label() == "y = x" for line in scatter.lines)


def test_a_sweep_written_before_the_renames_still_collects_and_draws(tmp_path):
    """benchmarks/cost_model_k_sweep's jobs were written before summary.json's `k` became `k_max` and the
    runtime's and K policies' `_target_`s moved: they collect with their K maximum and draw speedup_vs_k."""
    import shutil

    from specexp.reporting.job_table import collect
    from tests.commands import REPO

    shutil.copytree(REPO / "benchmarks" / "cost_model_k_sweep", tmp_path / "sweep")
    assert all("k_max" not in json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/summary.json"))
    table = collect([tmp_path / "sweep"])
    assert len(table) >= 20 and table["k_max"].notna().all() and table["k_max"].max() == 8
    written, skipped = make_figures([tmp_path / "sweep"], tmp_path / "figures")
    assert "speedup_vs_k.pdf" in written, skipped
