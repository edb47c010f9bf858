"""The calibrated cost model on hand-checked cases: acceptance by proposal length, expected tokens,
the prediction for a hand-made run under a hand-written profile, and draft.k=auto's choices."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from specexp.core.interface import Context, Proposal, RoundSeen
from specexp.core.metrics import slot_counts
from specexp.costs import cost_model
from specexp.costs.hardware_profile import Profile
from specexp.errors import UserInputError
from specexp.k_policy.heuristic import HeuristicK
from specexp.k_policy.priced import PricedK, expected_tokens
from specexp.k_policy.tree import PricedTreeK
from specexp.study.summary import RunFacts, summarize
from tests.commands import run_each, run_module


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
    s = summarize(rounds, batches, RunFacts(k=2, profile=hand_profile(), draft_profile="d")).to_dict()
    # Curve: a1 = 2/3, a2 = 1/2 -> E[tokens | 2 proposed] = 1 + 2/3 + 1/3 = 2 per round.
    assert s["predicted_tokens_per_round"] == pytest.approx(2.0)
    prefill = 0.125  # interpolated at 160 tokens
    spec_s = prefill + 0.02 + 6 * 3 * (0.010 + 0.2 + 0.01) / 6.0
    ar_s = prefill + 6 * (0.1 + 0.01)
    assert s["predicted_speedup"] == pytest.approx(ar_s / spec_s)
    assert s["realized_over_predicted"] == pytest.approx(s["speedup"] / s["predicted_speedup"])
    assert s["predicted_time_split"]["target"] == pytest.approx(0.6)


def round_seen(proposal: Proposal, accepted, active=None) -> RoundSeen:
    """What the engine reads back of a round in which ``proposal`` had ``accepted`` [B] tokens accepted."""
    proposed = proposal.n_proposed.numpy()
    accepted = np.asarray(accepted)
    active = np.ones(len(proposed), dtype=bool) if active is None else np.asarray(active)
    group = proposal.group.numpy() if proposal.group is not None else np.zeros_like(proposed)
    path = proposal.accepted_path.numpy() if proposal.accepted_path is not None else \
        np.where(np.arange(proposal.tokens.shape[1]) < accepted[:, None], np.arange(proposal.tokens.shape[1]), -1)
    return RoundSeen(n_proposed=proposed, depth=proposed, n_accepted=accepted, n_emitted=accepted + 1, active=active,
                     group=group, path=path, n_nodes=proposal.tokens.shape[1])


def context(batch_size: int, length: int = 100) -> Context:
    return Context(tokens=torch.zeros(batch_size, length + 16, dtype=torch.long),
                   start=torch.zeros(batch_size, dtype=torch.long), lengths=torch.full((batch_size,), length),
                   done=torch.zeros(batch_size, dtype=torch.bool))


def test_expected_tokens_counts_each_rows_limit():
    run = np.array([[0.5, 0.25], [1.0, 1.0]])
    assert expected_tokens(run, np.array([2, 1]), 2).tolist() == [2.0, 3.5, 3.75]


@pytest.mark.parametrize(("pass_cost", "expected_k"), [(0.0, 8), (1.0, 0)])
def test_model_k_drafts_long_when_passes_are_free_and_not_at_all_when_each_token_costs_a_step(pass_cost, expected_k):
    """Acceptance learnt from observed rounds (0.9, then 1): with a pass costing the same for any
    size it pays to draft K_max; when each verified token costs one more AR step, no K pays."""
    k_max = 8

    def pass_seconds(length):  # K = 0..k_max -> T(K + 1) + bookkeeping
        return 0.02 * (1 + pass_cost * np.arange(k_max + 1)) + 0.001

    policy = PricedK(pass_seconds, np.r_[0.0, np.full(k_max, 1e-4)], probe_every=10**9)
    policy.begin(1, k_max, 64)
    proposal = Proposal(tokens=torch.zeros(1, k_max, dtype=torch.long), probs=torch.zeros(1, k_max, 4),
                        n_proposed=torch.tensor([k_max]))
    for accepted in [8] * 9 + [0]:  # position 1 accepted 9 times of 10, the rest whenever reached
        policy.observe(round_seen(proposal, [accepted]))
    assert policy.choose(context(1)) == expected_k


def test_model_k_keeps_what_pays_of_a_free_drafts_proposal_by_group():
    """Prompt lookup: after a long match (group 3) its tokens are accepted, after a 1-token match
    (group 1) never; a pass costs 1.5x per extra token: keep group 3's proposal, cut group 1's."""
    k_max = 4
    policy = PricedK(lambda length: 0.02 * (1 + 0.5 * np.arange(k_max + 1)), np.zeros(k_max + 1), free_groups=4,
                    probe_every=10**9)
    policy.begin(1, k_max, 64)
    full = Proposal(tokens=torch.zeros(1, k_max, dtype=torch.long), probs=torch.zeros(1, k_max, 4),
                    n_proposed=torch.tensor([k_max]))
    for group, accepted in [(3, 4), (1, 0)] * 10:
        full.group = torch.tensor([group])
        policy.observe(round_seen(full, [accepted]))
    assert policy.choose(context(1)) == k_max  # a free draft proposes all it has
    full.group = torch.tensor([3])
    assert policy.shorten(full, context(1)).tokens.shape[1] == k_max
    full.group = torch.tensor([1])
    assert policy.shorten(full, context(1)).tokens.shape[1] == 0


def batch16_prices(length):  # K = 0..4 -> T(K + 1) + bookkeeping: each verified token costs 40% of a step
    return 0.06 * (1 + 0.4 * np.arange(5)) + 0.001


@pytest.mark.parametrize(("profile_alpha", "expected_k"), [(0.2, 0), (0.95, 4)])
def test_model_k_starts_from_the_drafts_profiled_acceptance(profile_alpha, expected_k):
    """Before any round of its own, the policy prices with the acceptance the draft showed in its
    profiling decodes (worth 16 observations): a draft accepted 20% of the time and costing 1/12 of a
    step a round is not asked even as a probe where a pass costs 40% more per token; one accepted
    95% drafts at once."""
    reached = np.array([400.0, 120, 36, 11])
    policy = PricedK(batch16_prices, np.r_[0.0, np.full(4, 5e-3)], prior_counts=(profile_alpha * reached, reached))
    policy.begin(16, 4, 64)
    chosen = [policy.choose(context(16)) for _ in range(24)]  # three probe turns, nothing observed
    assert set(chosen) == {expected_k}


def test_model_k_prices_a_drafts_fill_until_its_first_proposal():
    """A draft whose first proposal of a batch costs a 1 s fill (a model draft's prompt pass) is not
    worth asking with 8 tokens left; with 4096 left, or once it has proposed, it is."""
    reached = np.array([100.0, 50, 25, 12])
    policy = PricedK(batch16_prices, np.r_[0.0, np.full(4, 1e-3)], prior_counts=(0.9 * reached, reached),
                    fill_seconds=1.0, probe_every=10**9)
    policy.begin(1, 4, max_new_tokens=9)
    assert policy.choose(context(1)) == 0
    policy.begin(1, 4, max_new_tokens=4096)
    k = policy.choose(context(1))
    assert k > 0
    policy.begin(1, 4, max_new_tokens=9)
    policy.drafted = True  # as after its first proposal
    assert policy.choose(context(1)) == k


def test_model_k_does_not_ask_a_free_draft_that_cannot_pay():
    """Prompt lookup whose proposals are never accepted, at batch 16 where each verified token costs
    40% of a step: once that is clear the lookup is not run at all (K = 0), not run and then cut."""
    policy = PricedK(batch16_prices, np.r_[0.0, np.full(4, 2e-3)], free_groups=3, probe_every=10**9)
    policy.begin(16, 4, 64)
    assert policy.choose(context(16)) == 4  # the prior (0.3, weak) leaves room for a long match to pay
    full = Proposal(tokens=torch.zeros(16, 4, dtype=torch.long), probs=torch.zeros(16, 4, 4),
                    n_proposed=torch.full((16,), 4), group=torch.arange(16) % 3)
    for _ in range(20):
        policy.observe(round_seen(full, np.zeros(16, dtype=np.int64)))
    assert policy.choose(context(16)) == 0


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


def test_a_draft_that_keeps_declining_is_priced_once_per_probe_round():
    """A model draft that declined learns nothing until it drafts again: it is priced anew only on
    probe rounds (every probe_every-th, where a close call may propose one more), not every round
    (each pricing cost ~1% of a round). One that pays is priced each round (through the memo)."""
    k_max = 8
    seconds = 0.025 * (1 + 0.05 * np.arange(k_max + 1))

    def policy_and_pricings(accepted_of_20: float) -> tuple[PricedK, list[int]]:
        policy = PricedK(lambda context: seconds, 0.004 * np.arange(k_max + 1), fill_seconds=0.01,
                        prior_counts=(np.full(k_max, accepted_of_20), np.full(k_max, 20.0)))
        priced, best = [], policy._best
        policy._best = lambda *args: priced.append(policy.rounds + 1) or best(*args)
        return policy, priced

    ctx = Context(tokens=torch.zeros(1, 200, dtype=torch.long), start=torch.zeros(1, dtype=torch.long),
                  lengths=torch.tensor([100]), done=torch.zeros(1, dtype=torch.bool))
    declining, priced = policy_and_pricings(1.0)  # accepted 1 in 20: never pays
    declining.begin(1, k_max, 64)
    chosen = []
    for _ in range(24):  # three refreshes (probe_every = 8)
        chosen.append(declining.choose(ctx))
        ctx.lengths += 1
    assert chosen == [0] * 24 and priced == [1, 8, 16, 24] and declining.rounds == 24
    paying, priced = policy_and_pricings(18.0)
    paying.begin(1, k_max, 64)
    assert all(paying.choose(ctx) > 0 for _ in range(10)) and priced == list(range(1, 11))


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


RECORDED_SWEEP = Path(__file__).resolve().parent.parent / "benchmarks" / "cost_model_k_sweep"


def test_the_model_curve_passes_within_10_percent_of_a_recorded_sweep():
    """benchmarks/cost_model_k_sweep: experiment=k_sweep as run for docs/lab_notes/cost_model.md (2-core AMD
    EPYC). Each draft's curve (its K = 8 run re-priced at K = 1..8 under the run's profile) against
    the speedup measured at every fixed K of the sweep."""
    from specexp.reporting import paper_figures as figures

    jobs = figures.study_jobs([RECORDED_SWEEP])
    model, label = figures.model_curves(jobs)
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
    folder = tmp_path_factory.mktemp("bad_k")
    runs = {override: folder / str(i) for i, override in enumerate(BAD_K_SETTINGS)}
    calls = {override: ("specexp", ["size=smoke", *override.split(), f"hydra.run.dir={run}"])
             for override, run in runs.items()}
    return {override: (runs[override], out) for override, out in run_each(calls).items()}


@pytest.mark.default_target
@pytest.mark.xdist_group("bad_k_runs")  # one worker: the batch runs once
@pytest.mark.parametrize("override", BAD_K_SETTINGS)
def test_bad_k_and_profile_settings_fail_in_one_line(override, bad_k_runs):
    run_dir, out = bad_k_runs[override]
    assert out.returncode == 2 and BAD_K_SETTINGS[override] in out.stderr and "Traceback" not in out.stderr
    assert not run_dir.exists()


def test_slot_counts_count_tree_slots_and_the_accepted_path():
    path = np.array([[0, 2, -1], [1, -1, -1], [0, 3, 5]])  # rows' accepted nodes
    reached, accepted = slot_counts(np.array([4, 2, 6]), path, np.array([True, True, False]), 5)
    assert reached.tolist() == [2, 2, 1, 1, 0] and accepted.tolist() == [1, 1, 1, 0, 0]


def tree_proposal(n: int) -> Proposal:
    return Proposal(tokens=torch.zeros(1, n, dtype=torch.long), probs=torch.zeros(1, n, 4),
                    n_proposed=torch.tensor([n]), parents=torch.full((1, n), -1))


@pytest.mark.parametrize(("slot_rates", "expected"), [([0.6, 0.4, 0.05, 0.05], 2), ([0.9, 0.8, 0.7, 0.6], 4),
                                                      ([0.05, 0.05, 0.05, 0.05], 0)])
def test_tree_k_takes_the_budget_whose_slots_pay_for_their_pass(slot_rates, expected):
    """Each node verified costs 20% of a step and a draft step 1%: a budget of N nodes yields
    1 + the first N slot rates, over 1 + 0.2 N steps (+ 1% per draft step). Rates 0.6, 0.4, then
    0.05: two nodes (2.0 / 1.41 beats 1.6 / 1.21 and 2.05 / 1.61); rates 0.9..0.6: all four; 0.05
    each: no draft (1.05 / 1.21 < 1)."""
    k_max = 4
    policy = PricedTreeK(lambda length: 0.02 * (1 + 0.2 * np.arange(k_max + 1)), np.r_[0.0, np.full(k_max, 2e-4)],
                   probe_every=10**9)
    policy.begin(1, k_max, 64)
    rng = np.random.default_rng(0)
    for _ in range(400):  # slot s on the path with its rate (a slot's ancestors aside: the policy counts slots)
        proposal = tree_proposal(k_max)
        on_path = [s for s in range(k_max) if rng.random() < slot_rates[s]]
        proposal.accepted_path = torch.tensor([on_path + [-1] * (k_max - len(on_path))])
        policy.observe(round_seen(proposal, [len(on_path)]))
    np.testing.assert_allclose(policy.rates(), slot_rates, atol=0.06)
    assert policy.choose(context(1)) == expected


def test_tree_k_starts_from_the_profiles_slot_rates_and_probes_one_node_more():

    k_max = 4
    """Profiled slot rates 0.6, 0.4 (100 decodes each), 0.05 (seen in 4): two nodes pay; every 4th
    round a third, whose rate two standard errors up (0.29) would."""
    reached = np.array([100.0, 100, 4, 4])
    policy = PricedTreeK(lambda length: 0.02 * (1 + 0.2 * np.arange(k_max + 1)), np.zeros(k_max + 1),
                   prior_counts=(np.array([0.6, 0.4, 0.05, 0.05]) * reached, reached), probe_every=4)
    policy.begin(1, k_max, 64)
    chosen = [policy.choose(context(1)) for _ in range(8)]
    assert chosen == [2, 2, 2, 3, 2, 2, 2, 3]


@pytest.mark.default_target
def test_a_dynamic_tree_at_tree_auto_runs_from_the_cli_with_profiled_slot_rates(tmp_path):
    """draft.tree=auto (draft.k=auto with draft.branches > 1): the node budget chosen each round
    (PricedTreeK), priced by the tree draft's own profile entry (its cost at every budget and its slot
    rates); exact."""
    out = run_module("specexp", "size=smoke", "draft=distilled", "draft.branches=2", "draft.k=3", "draft.tree=auto",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["k_policy"] == "auto" and summary["greedy_match"] == 1.0
    entry = json.loads((tmp_path / "run" / "profile.json").read_text())["drafts"][summary["draft_profile"]]
    assert len(entry["slot_reached"]) == 8 and entry["slot_reached"][0] > 0
    assert 0 <= entry["slot_accepted"][0] <= entry["slot_reached"][0]


def test_draft_k_heuristic_builds_the_draft_for_k_max_under_hf_schedule(target):
    """draft.k=heuristic as a study wires it: the draft built for k_max, HF's schedule choosing each
    round's K with no profile (its schedule is test_engine's heuristic test)."""
    from hydra import compose, initialize_config_dir

    from specexp.drafts.build import build_draft
    from specexp.k_policy import make_policy
    from specexp.paths import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["draft=prompt_lookup", "draft.k=heuristic", "draft.k_max=6"])
    built = build_draft(cfg.draft, target)
    assert built.policy == "heuristic" and built.k_max == 6 == built.drafter.traits.k_max
    assert isinstance(make_policy(built.policy, None, "prompt_lookup", built.drafter), HeuristicK)
