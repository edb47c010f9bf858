"""The speculative rule: exact greedy behaviour and, statistically, the target's distribution."""

import pytest
import torch

from specexp.core.sampling import SamplingConfig, logits_to_probs, sample
from specexp.core.verify import tree_verify
from tests.stats import P_VALUE_THRESHOLD, chi_square_p_value


def chain_verify(draft_tokens, draft_probs, target_probs, generator):
    """The rule on a chain of K tokens per row: n_accepted [B] and the next token [B]."""
    return tree_verify(draft_tokens, None, draft_probs, target_probs, generator)[1:]


TRIALS = 200_000  # rows of one batched call: each row is an independent trial
V = 7


def _setup(seed: int, K: int, warp: SamplingConfig, q_mode: str):
    """Random p [K+1, V] and q [K, V] through the shared warp, broadcast over TRIALS rows.

    q_mode: "independent" (supports may even be disjoint), "near_p" (a draft close to p, so
    every path, the bonus one too, is taken often) or "one_hot" (a deterministic draft whose
    token lies in p's support).
    """
    g = torch.Generator().manual_seed(seed)
    p = logits_to_probs(2 * torch.randn(K + 1, V, generator=g), warp)
    if q_mode == "independent":
        q = logits_to_probs(2 * torch.randn(K, V, generator=g), warp)
    elif q_mode == "near_p":
        q = logits_to_probs(torch.log(p[:K] + 1e-3) + 0.5 * torch.randn(K, V, generator=g), warp)
    else:
        q = torch.nn.functional.one_hot(sample(p[:K], g), V).float()
    q_rows = q.expand(TRIALS, K, V)
    draft_tokens = sample(q_rows, g)  # [TRIALS, K]: x_i ~ q_i
    n_acc, nxt = chain_verify(draft_tokens, q_rows, p.expand(TRIALS, K + 1, V), g)
    return p, draft_tokens, n_acc, nxt


def _emitted(i: int, draft_tokens, n_acc, nxt):
    """Token emitted at position i (for rows that got that far)."""
    return torch.where(n_acc > i, draft_tokens[:, min(i, draft_tokens.shape[1] - 1)], nxt)


WARPS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.6_topk4": SamplingConfig(temperature=0.6, top_k=4),
    "t1.3_topp0.8": SamplingConfig(temperature=1.3, top_p=0.8),
}


@pytest.mark.parametrize("warp", WARPS.values(), ids=WARPS.keys())
@pytest.mark.parametrize("seed", [7, 8])
def test_first_token_follows_p_for_any_q(warp, seed):
    p, drafted, n_acc, nxt = _setup(seed=seed, K=3, warp=warp, q_mode="independent")
    first = _emitted(0, drafted, n_acc, nxt)
    assert chi_square_p_value(torch.bincount(first, minlength=V), p[0]) > P_VALUE_THRESHOLD


@pytest.mark.parametrize("warp", WARPS.values(), ids=WARPS.keys())
@pytest.mark.parametrize("q_mode", ["near_p", "one_hot"])
def test_first_two_tokens_follow_p(warp, q_mode):
    K = 3
    p, drafted, n_acc, nxt = _setup(seed=7, K=K, warp=warp, q_mode=q_mode)
    first = _emitted(0, drafted, n_acc, nxt)
    assert chi_square_p_value(torch.bincount(first, minlength=V), p[0]) > P_VALUE_THRESHOLD
    # Given the first draft token was accepted, the second emitted token follows p_1.
    reached = n_acc >= 1
    assert reached.sum() > 1000
    second = _emitted(1, drafted[reached], n_acc[reached], nxt[reached])
    assert chi_square_p_value(torch.bincount(second, minlength=V), p[1]) > P_VALUE_THRESHOLD


@pytest.mark.parametrize("warp", WARPS.values(), ids=WARPS.keys())
def test_bonus_token_follows_last_target_position(warp):
    K = 2
    p, drafted, n_acc, nxt = _setup(seed=3, K=K, warp=warp, q_mode="near_p")
    all_accepted = n_acc == K
    assert all_accepted.sum() > 5000
    assert chi_square_p_value(torch.bincount(nxt[all_accepted], minlength=V), p[K]) > P_VALUE_THRESHOLD


def test_one_hot_p_and_q_is_the_greedy_rule():
    g = torch.Generator().manual_seed(0)
    B, K, Vg = 500, 5, 11
    greedy = SamplingConfig()
    target_argmax = torch.randint(Vg, (B, K + 1), generator=g)
    # Drafts that agree for a random prefix, then disagree.
    agree_len = torch.randint(K + 1, (B,), generator=g)
    drafted = torch.where(torch.arange(K) < agree_len[:, None], target_argmax[:, :K], (target_argmax[:, :K] + 1) % Vg)
    p = logits_to_probs(torch.nn.functional.one_hot(target_argmax, Vg).double(), greedy)
    q = logits_to_probs(torch.nn.functional.one_hot(drafted, Vg).double(), greedy)
    n_acc, nxt = chain_verify(drafted, q, p, g)
    assert torch.equal(n_acc, agree_len)
    assert torch.equal(nxt, target_argmax.gather(1, agree_len[:, None]).squeeze(1))


def test_zero_q_position_is_rejected_and_resampled_from_p():
    """Proposal padding: q == 0 from position m on gives the bonus from p_m."""
    g = torch.Generator().manual_seed(0)
    B, K, Vg, m = 50_000, 3, 5, 1
    p = torch.softmax(torch.randn(K + 1, Vg, generator=g), -1).expand(B, K + 1, Vg)
    drafted = torch.zeros(B, K, dtype=torch.long)
    q = torch.zeros(B, K, Vg)
    q[:, 0, 0] = 1.0  # one real proposal, then padding
    n_acc, nxt = chain_verify(drafted, q, p, g)
    assert int(n_acc.max()) <= m
    got_bonus = n_acc == m
    assert chi_square_p_value(torch.bincount(nxt[got_bonus], minlength=Vg), p[0, m]) > P_VALUE_THRESHOLD


def test_k_zero_samples_from_p():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(1, 1, 6, generator=g), -1).expand(100_000, 1, 6)
    n_acc, nxt = chain_verify(torch.zeros(100_000, 0, dtype=torch.long), torch.zeros(100_000, 0, 6), p, g)
    assert int(n_acc.max()) == 0
    assert chi_square_p_value(torch.bincount(nxt, minlength=6), p[0, 0]) > P_VALUE_THRESHOLD


def test_chi_square_detects_a_wrong_distribution():
    """The statistical check itself must be able to fail."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.2, 0.3, 0.5])
    draws = sample(torch.tensor([0.25, 0.3, 0.45]).expand(100_000, 3), g)
    assert chi_square_p_value(torch.bincount(draws, minlength=3), p) < P_VALUE_THRESHOLD
