"""The calibrated cost model and the hardware profile on hand-checked cases: acceptance by proposal length,
the prediction for a hand-made run under a hand-written profile, the profile's measuring and caching, and
bad K and profile settings (the K policies themselves: tests/k_policy/)."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from specexp.costs import cost_model
from specexp.costs.hardware_profile import Profile
from specexp.errors import UserInputError
from specexp.study.summary import RunFacts, summarize
from tests.commands import REPO, run_each_study, run_module


def hand_profile(pass_s=(0.1, 0.1, 0.2), overhead_s=0.01, draft_s=(0.005, 0.010), reset_s=0.02) -> Profile:
    """T(n) the same at every context (two lengths measured), a draft costing 5 ms per token."""
    return Profile(key={"target": "t", "cpu": "hand", "batch_size": 1, "runtime": {"name": "lean"}},
                   context_lengths=[64, 256], target_s=[list(pass_s), list(pass_s)], overhead_s=overhead_s,
                   prefill_s=[0.05, 0.2], drafts={"d": {"k": list(range(1, len(draft_s) + 1)), "draft_s": list(draft_s),
                                                        "reset_s": reset_s}})


def test_acceptance_by_length_separates_short_proposals_and_shrinks_rare_ones():
    proposed = np.array([1, 1, 1, 1, 3, 3, 3, 3])
    accepted = np.array([0, 0, 0, 1, 3, 3, 2, 3])
    table = cost_model.acceptance_by_length(proposed, accepted, 3, weight=0.0)
    assert table[1, 0] == 1 / 4 and table[3, 0] == 1.0 and table[3, 2] == 3 / 4
    pooled = cost_model.acceptance_by_length(proposed, accepted, 3, weight=1e9)
    assert pooled[1, 0] == pytest.approx(5 / 8)  # all weight on the pooled curve
    # 1 + P(x1) for p = 1; 1 + 1 + 1 + 3/4 for p = 3; kept to 2 tokens: 1 + 1 + 1
    assert cost_model.expected_emitted(table, np.array([0, 1, 3])).tolist() == [1.0, 1.25, 3.75]
    assert cost_model.expected_emitted(table, np.array([3]), limit=2).tolist() == [3.0]


def test_filled_curve_carries_the_last_measured_position():
    assert cost_model.filled_curve([0.5, None, 0.9], 4).tolist() == [0.5, 0.5, 0.9, 0.9]
    assert cost_model.filled_curve([None], 2).tolist() == [0.0, 0.0]


def test_profile_interpolates_in_context_and_extends_past_the_largest_pass():
    profile = Profile(key={}, context_lengths=[64, 256], target_s=[[1.0, 2.0], [3.0, 4.0]], overhead_s=0.0,
                      prefill_s=[1.0, 2.0], drafts={"d": {"k": [1, 2], "draft_s": [0.1, 0.3], "reset_s": 0.0}})
    assert profile.pass_s(1, 160).item() == pytest.approx(2.0)
    assert profile.pass_s(np.array([1, 2, 4]), 64).tolist() == [1.0, 2.0, 4.0]  # slope 1 per token past n = 2
    assert profile.pass_s(1, 448).item() == pytest.approx(5.0)  # extended along the last segment
    assert profile.draft_s("d", np.array([0, 1, 2, 3])).tolist() == pytest.approx([0.0, 0.1, 0.3, 0.5])
    assert profile.prefill(160) == pytest.approx(1.5)


def test_prediction_of_a_hand_made_run():
    """Spec: rounds proposing 2 tokens (k_round 2, pass of 3 tokens = 0.2 s, draft 0.010 s, bookkeeping
    0.01 s); AR: 1-token passes of 0.1 s + 0.01 s. Priced by hand below."""
    rounds = pd.DataFrame({
        "mode": ["spec"] * 3 + ["ar"] * 6, "batch": 0, "prompt_id": "p", "category": "c",
        "round": [0, 1, 2, 0, 1, 2, 3, 4, 5], "k": [2] * 3 + [0] * 6, "k_chosen": [2] * 3 + [0] * 6,
        "k_round": [2] * 3 + [0] * 6, "context": [100, 103, 104, 100, 101, 102, 103, 104, 105],
        "proposed": [2, 2, 2] + [0] * 6, "accepted": [2, 0, 1] + [0] * 6, "emitted": [3, 1, 2] + [1] * 6,
        "draft_s": [0.01] * 3 + [0.0] * 6, "reencode_s": 0.0, "target_s": [0.2] * 3 + [0.1] * 6, "verify_s": [0.01] * 9,
    })
    batches = pd.DataFrame({"mode": ["spec", "ar"], "batch": 0, "repeat": 0, "category": "c", "tokens": [7, 7],
                            "total_s": [0.9, 0.85], "prefill_s": [0.1, 0.1], "prompt_length": [160, 160]})
    s = summarize(rounds, batches, RunFacts(k_max=2, profile=hand_profile(), draft_profile="d")).to_dict()
    # Curve: a1 = 2/3, a2 = 1/2 -> E[tokens | 2 proposed] = 1 + 2/3 + 1/3 = 2 per round.
    assert s["predicted_tokens_per_round"] == pytest.approx(2.0)
    prefill = 0.125  # interpolated at 160 tokens
    spec_s = prefill + 0.02 + 6 * 3 * (0.010 + 0.2 + 0.01) / 6.0
    ar_s = prefill + 6 * (0.1 + 0.01)
    assert s["predicted_speedup"] == pytest.approx(ar_s / spec_s)
    assert s["realized_over_predicted"] == pytest.approx(s["speedup"] / s["predicted_speedup"])
    assert s["predicted_time_split"]["target"] == pytest.approx(0.6)


def test_a_draft_entry_is_measured_again_when_the_drafts_weights_change(tmp_path, monkeypatch):
    """A head retrained into the same folder keeps its config (the entry's name) but not its
    acceptance: the profile measures its entry again instead of starting K from the old head's."""
    from specexp.core.sampling import SamplingConfig
    from specexp.costs import hardware_profile as profile_module
    from specexp.drafts.small_lm import SmallLMDrafter
    from specexp.models import LoadedModel
    from tests.conftest import tiny_model

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    measured, measure_draft = [], profile_module.measure_draft
    monkeypatch.setattr(profile_module, "measure_draft", lambda *a, **kw: measured.append(1) or measure_draft(*a, **kw))
    target = LoadedModel(tiny_model(0, layers=1).model.float(), None, "tiny")
    draft = LoadedModel(tiny_model(1, layers=1).model.float(), None, "d")
    drafter = SmallLMDrafter(target, draft, k=2)

    def weights_in_profile() -> str:
        profile = profile_module.ensure_profile(target, target.model, {"name": "hf"}, drafter, "d", [5, 6, 7, 8], 1,
                                                SamplingConfig(), 2, [16], repeats=1, new_tokens=4)
        return profile.drafts["d"]["weights"]

    first = weights_in_profile()
    assert weights_in_profile() == first and len(measured) == 1  # unchanged weights: the cached entry
    with torch.no_grad():
        draft.model.lm_head.weight.mul_(1.5)
    assert weights_in_profile() != first and len(measured) == 2


def test_a_quick_profile_times_a_draft_at_a_few_k_and_interpolates_the_rest(tmp_path, monkeypatch):
    """profile.draft_ks (size=smoke): the draft's rounds timed at those K, 1 and the largest; every
    other K priced on the line between its neighbours (past the largest: the last segment's slope),
    and such a profile kept apart from one timed at every K."""
    from specexp.core.sampling import SamplingConfig
    from specexp.costs import hardware_profile as profile_module
    from specexp.drafts.small_lm import SmallLMDrafter
    from specexp.models import LoadedModel
    from tests.conftest import tiny_model

    assert profile_module.timed_ks(8, None, [2, 4]) == [1, 2, 4, 8]
    assert profile_module.timed_ks(8, 3, [2, 4]) == [1, 2, 3]  # Medusa's chain: at most its k_limit
    assert profile_module.timed_ks(8, None, None) == list(range(1, 9))
    with pytest.raises(UserInputError, match=r"profile.draft_ks=\[0, 2\] is not allowed"):
        profile_module.timed_ks(8, None, [0, 2])
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    target = LoadedModel(tiny_model(0, layers=1).model.float(), None, "tiny")
    drafter = SmallLMDrafter(target, LoadedModel(tiny_model(1, layers=1).model.float(), None, "d"), k=2)

    def profiled(draft_ks):
        return profile_module.ensure_profile(target, target.model, {"name": "hf"}, drafter, "d", [5, 6, 7, 8], 1,
                                             SamplingConfig(), 2, [16], repeats=1, new_tokens=4, draft_ks=draft_ks)

    quick, every = profiled([2, 4]), profiled(None)
    assert quick.path != every.path and every.drafts["d"]["k"] == list(range(1, 9))
    entry = quick.drafts["d"]
    assert entry["k"] == [1, 2, 4, 8] and len(entry["reached"]) == 8  # acceptance at every position still counted
    s = dict(zip(entry["k"], entry["draft_s"], strict=True))
    assert quick.draft_s("d", 3) == pytest.approx((s[2] + s[4]) / 2)
    assert quick.draft_s("d", 10) == pytest.approx(s[8] + (s[8] - s[4]) / 4 * 2)
    assert quick.draft_s("d", 0) == 0.0 and quick.draft_s("d", 4) == pytest.approx(s[4])


def test_jobs_sharing_the_profile_cache_take_turns(tmp_path, monkeypatch):
    """Parallel sweep jobs (joblib, xdist) that need the same profile: the target is measured once
    and each job's draft entry survives the other's save (without the lock both measure the target
    and the later save drops the earlier draft)."""
    import threading

    from specexp.core.sampling import SamplingConfig
    from specexp.costs import hardware_profile as profile_module
    from specexp.drafts.small_lm import SmallLMDrafter
    from specexp.models import LoadedModel
    from tests.conftest import tiny_model

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    timed, measure_target = [], profile_module.measure_target
    monkeypatch.setattr(profile_module, "measure_target", lambda *a, **kw: timed.append(1) or measure_target(*a, **kw))
    target = LoadedModel(tiny_model(0, layers=1).model.float(), None, "tiny")
    drafters = {name: SmallLMDrafter(target, LoadedModel(tiny_model(seed, layers=1).model.float(), None, name), k=2)
                for seed, name in ((1, "a"), (2, "b"))}
    start = threading.Barrier(len(drafters))

    def profile_with(name: str) -> None:
        start.wait()
        profile_module.ensure_profile(target, target.model, {"name": "hf"}, drafters[name], name, [5, 6, 7, 8], 1,
                                      SamplingConfig(), 2, [16], repeats=2, new_tokens=4)

    threads = [threading.Thread(target=profile_with, args=(name,)) for name in drafters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (path,) = (tmp_path / "profiles").glob("*.json")
    assert set(profile_module.Profile.load(path).drafts) == {"a", "b"} and len(timed) == 1


def test_profile_acceptance_counts_follow_the_rule():
    """Position i is reached when proposed and every earlier one was accepted; rows out of the
    round (finished) count nothing."""
    from types import SimpleNamespace

    from specexp.costs.hardware_profile import acceptance_counts

    out = SimpleNamespace(n_proposed=torch.tensor([[3, 2], [3, 0]]), n_accepted=torch.tensor([[1, 2], [3, 0]]),
                          active=torch.tensor([[True, True], [True, False]]))
    accepted, reached = acceptance_counts(out, 4)
    assert reached.tolist() == [3, 3, 1, 0] and accepted.tolist() == [3, 2, 1, 0]


RECORDED_SWEEP = REPO / "benchmarks" / "cost_model_k_sweep"


def test_the_model_curve_passes_within_10_percent_of_a_recorded_sweep():
    """benchmarks/cost_model_k_sweep: experiment=k_sweep as run for docs/lab_notes/cost_model.md (2-core AMD
    EPYC). Each draft's curve (its K = 8 run re-priced at K = 1..8 under the run's profile) against
    the speedup measured at every fixed K of the sweep."""
    from specexp.reporting import figure_tables as tables
    from specexp.reporting import job_profiles

    jobs = tables.study_jobs([RECORDED_SWEEP])
    model, label = job_profiles.model_curves(jobs)
    assert label.startswith("AMD EPYC") and set(model["draft"]) == {"prompt_lookup", "target_prefix", "distilled"}
    curve = model.set_index(["draft", "k"])["speedup"]
    fixed = jobs.dropna(subset=["k"])
    assert len(fixed) == 18
    for job in fixed.itertuples():
        assert abs(job.speedup / curve[(job.draft, int(job.k))] - 1) <= 0.10, (job.draft, job.k)
    # and every job of it, K chosen per round too, within [0.9, 1.1] of the model's prediction for it
    assert jobs["realized_over_predicted"].between(0.9, 1.1).all()


@pytest.mark.default_target
def test_profile_command_measures_prints_and_writes_a_profile_a_study_can_price_with(tmp_path):
    out = run_module("specexp.profile", "size=smoke", "draft=prompt_lookup,distilled", "--out",
                     str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "T(n)/T(1) n=1..9" in out.stdout and "draft PromptLookupDrafter" in out.stdout
    profile = Profile.load(tmp_path / "p.json")
    assert len(profile.target_s) == 2 and len(profile.target_s[0]) == 9  # size=smoke: 2 context lengths
    assert sum(name.startswith(("PromptLookupDrafter", "distilled_drafter")) for name in profile.drafts) >= 2
    assert all(np.all(np.diff(row) >= 0) for row in profile.target_s)  # a longer pass never costs less
    priced = run_module("specexp", "size=smoke", "draft=distilled", f"profile.path={tmp_path / 'p.json'}",
                        f"hydra.run.dir={tmp_path / 'run'}")
    assert priced.returncode == 0, priced.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["profile"] == str(tmp_path / "p.json") and summary["predicted_speedup"] > 0


BAD_K_SETTINGS = {
    "draft.k=sometimes": "draft.k=sometimes is not allowed; give an integer >= 1 (0: never propose, the A/A control), "
                         "or one of: auto, heuristic",
    "draft.k_max=0": "draft.k_max=0 is not allowed",
    "profile.path=/nonexistent.json": "profile.path='/nonexistent.json' is not a file",
    "profile.draft_ks=[0,2]": "profile.draft_ks=[0, 2] is not allowed; give K >= 1, or null for every K",
    "draft=distilled draft.tree=auto": "draft.tree=auto sizes a token tree; give draft.branches >= 2 "
                                       "(draft.branches=1)",
    "draft.branches=3": "draft.k=auto prices chains, and with auto the dynamic trees of a draft that grows them "
                        "(traits.grows_trees); this token tree (draft.branches=3) takes a fixed node budget",
}


@pytest.fixture(scope="module")
def bad_k_runs(tmp_path_factory) -> dict:
    """Each BAD_K_SETTINGS study, in one interpreter: override -> (its run folder, CompletedProcess)."""
    return run_each_study(tmp_path_factory.mktemp("bad_k"),
                          {override: ["size=smoke", *override.split()] for override in BAD_K_SETTINGS})


@pytest.mark.default_target
@pytest.mark.xdist_group("bad_k_runs")  # one worker: the batch runs once
@pytest.mark.parametrize("override", BAD_K_SETTINGS)
def test_bad_k_and_profile_settings_fail_in_one_line(override, bad_k_runs):
    run_dir, out = bad_k_runs[override]
    assert out.returncode == 2 and BAD_K_SETTINGS[override] in out.stderr and "Traceback" not in out.stderr
    assert not run_dir.exists()


