"""draft.k's policies on hand-checked cases (specexp/k_policy/): expected tokens, the priced K of a chain
(PricedK) and of a dynamic tree's node budget (PricedTreeK) under hand-written prices, and the heuristic
as a study wires it."""

import json

import numpy as np
import pytest
import torch

from specexp.core.interface import Context, Proposal, RoundSeen
from specexp.core.metrics import slot_counts
from specexp.k_policy.heuristic import HeuristicK
from specexp.k_policy.priced import PricedK, expected_tokens
from specexp.k_policy.tree import PricedTreeK
from tests.commands import run_module


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
def test_priced_k_drafts_long_when_passes_are_free_and_not_at_all_when_each_token_costs_a_step(pass_cost, expected_k):
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


def test_priced_k_keeps_what_pays_of_a_free_drafts_proposal_by_group():
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
def test_priced_k_starts_from_the_drafts_profiled_acceptance(profile_alpha, expected_k):
    """Before any round of its own, the policy prices with the acceptance the draft showed in its
    profiling decodes (worth 16 observations): a draft accepted 20% of the time and costing 1/12 of a
    step a round is not asked even as a probe where a pass costs 40% more per token; one accepted
    95% drafts at once."""
    reached = np.array([400.0, 120, 36, 11])
    policy = PricedK(batch16_prices, np.r_[0.0, np.full(4, 5e-3)], prior_counts=(profile_alpha * reached, reached))
    policy.begin(16, 4, 64)
    chosen = [policy.choose(context(16)) for _ in range(24)]  # three probe turns, nothing observed
    assert set(chosen) == {expected_k}


def test_priced_k_prices_a_drafts_fill_until_its_first_proposal():
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


def test_priced_k_does_not_ask_a_free_draft_that_cannot_pay():
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


def test_slot_counts_count_tree_slots_and_the_accepted_path():
    path = np.array([[0, 2, -1], [1, -1, -1], [0, 3, 5]])  # rows' accepted nodes
    reached, accepted = slot_counts(np.array([4, 2, 6]), path, np.array([True, True, False]), 5)
    assert reached.tolist() == [2, 2, 1, 1, 0] and accepted.tolist() == [1, 1, 1, 0, 0]


def tree_proposal(n: int) -> Proposal:
    return Proposal(tokens=torch.zeros(1, n, dtype=torch.long), probs=torch.zeros(1, n, 4),
                    n_proposed=torch.tensor([n]), parents=torch.full((1, n), -1))


@pytest.mark.parametrize(("slot_rates", "expected"), [([0.6, 0.4, 0.05, 0.05], 2), ([0.9, 0.8, 0.7, 0.6], 4),
                                                      ([0.05, 0.05, 0.05, 0.05], 0)])
def test_priced_tree_k_takes_the_budget_whose_slots_pay_for_their_pass(slot_rates, expected):
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


def test_priced_tree_k_starts_from_the_profiles_slot_rates_and_probes_one_node_more():

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
