"""Tree verification: the emitted tokens follow the target for every way of drawing siblings.

A toy target and draft are tables indexed by the tokens after the committed tip (V = 4, paths up
to 3 tokens): p after a path is the same wherever that path sits in a tree, as for a real model.
Each trial row draws its own tree, the rule walks it, and the trial's first three tokens are
completed (when the round emitted fewer) by drawing from the target at the path it reached, as
the next round would. Their joint distribution must be the target's: p(a) p(b|a) p(c|a,b), 64
cells, one chi-square test each (false-failure rate P_VALUE_THRESHOLD, tests/stats.py).
"""

import pytest
import torch

from specexp.core.sampling import SamplingConfig, logits_to_probs, sample
from specexp.core.tree import chain_parents, tree_depths
from specexp.core.verify import greedy_verify, tree_verify
from tests.stats import P_VALUE_THRESHOLD, chi_square_p_value

TRIALS = 200_000
V = 4
DEPTH = 3  # tables cover paths of up to 3 tokens


def tables(seed: int, warp: SamplingConfig) -> list[torch.Tensor]:
    """Distributions after each path of 0..DEPTH tokens: tables[d] has shape [V]*d + [V]."""
    g = torch.Generator().manual_seed(seed)
    return [logits_to_probs(2 * torch.randn(*([V] * d), V, generator=g), warp) for d in range(DEPTH + 1)]


def after(table: list[torch.Tensor], path: list[torch.Tensor]) -> torch.Tensor:
    """The distribution after each row's path (a list of [T] token tensors) [T, V]."""
    if not path:
        return table[0].expand(TRIALS, V)
    return table[len(path)][tuple(path)]


def draw_tree(parents: list[int], modes: list[str], p: list[torch.Tensor], q: list[torch.Tensor], g):
    """Each row's tree of len(parents) nodes: tokens [T, N], the q each was drawn from [T, N, V],
    the target's p at the root and after every node [T, N+1, V]. modes[i]: how node i is drawn
    given its earlier siblings: "iid" (the parent's q), "without" (the parent's q without the
    earlier siblings' tokens, renormalised), "one_hot" (the draft's (j+1)-th likeliest token for
    the j-th sibling, q one-hot), "pad" (a padding node, q all zero)."""
    N = len(parents)
    tokens = torch.zeros(TRIALS, N, dtype=torch.long)
    draft = torch.zeros(TRIALS, N, V)
    target = torch.zeros(TRIALS, N + 1, V)
    target[:, 0] = p[0]
    paths: list[list[torch.Tensor]] = []
    for i, (parent, mode) in enumerate(zip(parents, modes, strict=True)):
        prefix = [] if parent < 0 else paths[parent]
        base = after(q, prefix)  # [T, V]
        earlier = [j for j in range(i) if parents[j] == parent and modes[j] != "pad"]
        if mode == "iid":
            q_i = base
        elif mode == "without":
            q_i = base.clone()
            for j in earlier:
                q_i.scatter_(1, tokens[:, j : j + 1], 0.0)
            q_i = q_i / q_i.sum(-1, keepdim=True)
        elif mode == "one_hot":
            ranked = base.argsort(-1, descending=True)[:, len(earlier)]
            q_i = torch.nn.functional.one_hot(ranked, V).float()
        else:
            q_i = torch.zeros(TRIALS, V)
        tokens[:, i] = sample(q_i, g) if mode != "pad" else 0
        draft[:, i] = q_i
        paths.append([*prefix, tokens[:, i]])
        target[:, i + 1] = after(p, paths[-1]) if len(paths[-1]) <= DEPTH else p[0]
    return tokens, draft, target


def first_three(tokens, path, n_accepted, next_token, p, g) -> torch.Tensor:
    """Each trial's first three tokens [T, 3]: the accepted path, the next token, then draws from
    the target after what came before (the next rounds)."""
    emitted = torch.where(torch.arange(path.shape[1]) < n_accepted[:, None],
                          tokens.gather(1, path.clamp_min(0)), -1)  # [T, D]
    emitted = torch.cat([emitted, torch.full((TRIALS, 3), -1)], 1)
    emitted.scatter_(1, n_accepted[:, None], next_token[:, None])
    out = emitted[:, :3].clone()
    for d in range(3):
        missing = out[:, d] < 0
        out[:, d] = torch.where(missing, sample(after(p, [out[:, j] for j in range(d)]).clamp_min(0), g), out[:, d])
    return out


def joint(p: list[torch.Tensor]) -> torch.Tensor:
    """p(a) p(b|a) p(c|a,b) as a flat [V^3] vector."""
    return (p[0][:, None, None] * p[1][:, :, None] * p[2]).reshape(-1)


# parents, per-node draw modes: a root with 3 children (the first with 2 children, one with a child)
TREE = [-1, -1, -1, 0, 0, 1, 3]
SHAPES = {
    "iid": ["iid"] * 7,
    "without": ["without"] * 7,
    "one_hot": ["one_hot"] * 7,
    "mixed_with_padding": ["without", "pad", "one_hot", "iid", "iid", "without", "one_hot"],
}
WARPS = {"t1": SamplingConfig(temperature=1.0), "t0.7_topk3": SamplingConfig(temperature=0.7, top_k=3)}


@pytest.mark.parametrize("warp", WARPS.values(), ids=WARPS.keys())
@pytest.mark.parametrize("shape", SHAPES)
def test_tree_emits_the_targets_distribution(shape, warp):
    g = torch.Generator().manual_seed(11)
    p, q = tables(1, warp), tables(2, SamplingConfig(temperature=1.3))
    tokens, draft, target = draw_tree(TREE, SHAPES[shape], p, q, g)
    parents = torch.tensor(TREE).expand(TRIALS, -1)
    path, n_accepted, next_token = tree_verify(tokens, parents, draft, target, g)
    assert path.shape == (TRIALS, 3) and int(n_accepted.max()) == 3  # the deepest path is accepted at times
    drawn = first_three(tokens, path, n_accepted, next_token, p, g)
    counts = torch.bincount((drawn * torch.tensor([V * V, V, 1])).sum(1), minlength=V**3)
    assert chi_square_p_value(counts, joint(p)) > P_VALUE_THRESHOLD


def test_rows_of_a_batch_walk_their_own_trees():
    """B > 1 with different tree shapes per row (the smaller padded): each row's emitted tokens
    follow the target; the rows never accept a padding node."""
    g = torch.Generator().manual_seed(5)
    warp = SamplingConfig(temperature=1.0)
    p, q = tables(3, warp), tables(4, warp)
    wide, wide_modes = [-1, -1, -1, -1, 0, 0], ["without"] * 6
    deep, deep_modes = [-1, 0, 1, -1, -1, -1], ["iid", "iid", "iid", "pad", "pad", "pad"]
    a = draw_tree(wide, wide_modes, p, q, g)
    b = draw_tree(deep, deep_modes, p, q, g)
    odd = (torch.arange(TRIALS) % 2 == 1)[:, None]
    tokens, draft, target = (torch.where(odd if x.dim() == 2 else odd[..., None], y, x)
                             for x, y in zip(a, b, strict=True))
    parents = torch.where(odd, torch.tensor(deep), torch.tensor(wide))
    path, n_accepted, next_token = tree_verify(tokens, parents, draft, target, g)
    assert int(n_accepted[~odd[:, 0]].max()) == 2 and int(n_accepted[odd[:, 0]].max()) == 3
    assert not bool(((path >= 3) & odd).any())  # the deep rows' padding nodes 3..5
    drawn = first_three(tokens, path, n_accepted, next_token, p, g)
    counts = torch.bincount((drawn * torch.tensor([V * V, V, 1])).sum(1), minlength=V**3)
    assert chi_square_p_value(counts, joint(p)) > P_VALUE_THRESHOLD


def test_a_chain_takes_the_walks_path_to_the_bit():
    """parents None (the accepted prefix, no walk) gives what the walk gives over parents i - 1."""
    g = torch.Generator().manual_seed(0)
    B, K, Vc = 50_000, 4, 9
    p = torch.softmax(2 * torch.randn(B, K + 1, Vc, generator=g), -1)
    q = torch.softmax(torch.log(p[:, :K] + 1e-3) + torch.randn(B, K, Vc, generator=g), -1)
    q[::7, 2:] = 0.0  # rows proposing fewer tokens: padding past their own count
    tokens = sample(q.clamp_min(0) + (q.sum(-1, keepdim=True) == 0), g)
    _, n_chain, next_chain = tree_verify(tokens, None, q, p, torch.Generator().manual_seed(1))
    path, n_tree, next_tree = tree_verify(tokens, chain_parents(B, K, tokens.device), q, p,
                                          torch.Generator().manual_seed(1))
    assert torch.equal(n_tree, n_chain) and torch.equal(next_tree, next_chain)
    assert torch.equal(path, torch.where(torch.arange(K) < n_chain[:, None], torch.arange(K), -1))


def test_one_hot_p_and_q_follow_the_targets_argmax_down_the_tree():
    """Greedy: the walk takes the child holding the target's argmax (the first such), down to
    where no child does; the next token is the argmax there."""
    greedy = SamplingConfig()
    tokens = torch.tensor([[5, 2, 7, 3, 1], [5, 2, 7, 3, 1]])
    parents = torch.tensor([[-1, -1, 0, 1, 1], [-1, -1, 0, 1, 1]])
    argmax = torch.tensor([[2, 9, 9, 9, 9, 9], [2, 9, 9, 4, 9, 9]])  # p at the root, then after node i
    p = logits_to_probs(torch.nn.functional.one_hot(argmax, 10).float(), greedy)
    q = torch.nn.functional.one_hot(tokens, 10).float()
    path, n_accepted, next_token = tree_verify(tokens, parents, q, p)
    # The root's argmax 2 is node 1's token (node 0's is 5); after node 1 (p index 2) the argmax 9
    # is neither of its children's (3, 1): next 9.
    assert path.tolist() == [[1, -1], [1, -1]] and n_accepted.tolist() == [1, 1]
    assert next_token.tolist() == [9, 9]
    argmax[1, 2] = 3  # after node 1 the target wants 3 = node 3's token
    p = logits_to_probs(torch.nn.functional.one_hot(argmax, 10).float(), greedy)
    path, n_accepted, next_token = tree_verify(tokens, parents, q, p)
    assert path.tolist() == [[1, -1], [1, 3]] and n_accepted.tolist() == [1, 2] and next_token.tolist() == [9, 9]


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_verify_is_the_rule_with_one_hot_p(shape):
    """greedy_verify (from p's hot ids) gives what tree_verify gives with p one-hot, on random trees and
    chains of 6 nodes over 4 tokens (so drafted tokens often are the argmax), with one-hot, spread and
    padding (all-zero) q's: the path, n_accepted and the next token, row for row."""
    g = torch.Generator().manual_seed(0)
    B, N, Vg = 4000, 6, 4
    parents = None if shape == "chain" else torch.stack(
        [torch.randint(-1, i, (B,), generator=g) if i else torch.full((B,), -1) for i in range(N)], 1)
    tokens = torch.randint(Vg, (B, N), generator=g)
    q = torch.softmax(torch.randn(B, N, Vg, generator=g), -1)
    q[::3] = torch.nn.functional.one_hot(tokens[::3], Vg).float()
    q[torch.rand(B, N, generator=g) < 0.15] = 0.0  # padding nodes
    argmax = torch.randint(Vg, (B, N + 1), generator=g)
    argmax[:, 1:] = torch.where(torch.rand(B, N, generator=g) < 0.6, tokens, argmax[:, 1:])  # often the drafted token
    one_hot_p = torch.nn.functional.one_hot(argmax, Vg).float()
    path, n_accepted, next_token = greedy_verify(tokens, parents, q, argmax)
    rule_path, rule_n, rule_next = tree_verify(tokens, parents, q, one_hot_p, torch.Generator().manual_seed(1))
    assert torch.equal(n_accepted, rule_n) and torch.equal(next_token, rule_next)
    D = rule_path.shape[1]
    assert torch.equal(path[:, :D], rule_path) and bool((path[:, D:] == -1).all())
    assert 0 < int(n_accepted.float().mean() * 10) and int(n_accepted.max()) >= 3  # the walks went deep


def test_depths_and_an_empty_tree():
    assert tree_depths(torch.tensor([[-1, 0, 1, -1, 3, 0]])).tolist() == [[1, 2, 3, 1, 2, 2]]
    p = torch.softmax(torch.randn(3, 1, 5), -1)
    path, n_accepted, next_token = tree_verify(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, dtype=torch.long),
                                               torch.zeros(3, 0, 5), p)
    assert path.shape == (3, 0) and n_accepted.tolist() == [0, 0, 0] and next_token.shape == (3,)


def test_the_test_catches_a_rule_without_the_sibling_residual():
    """Trying the next sibling against p itself (not the residual) over-emits the draft's tokens:
    the joint test above must see it."""
    g = torch.Generator().manual_seed(11)
    warp = SamplingConfig(temperature=1.0)
    p, q = tables(1, warp), tables(2, SamplingConfig(temperature=1.3))
    tokens, draft, target = draw_tree(TREE, SHAPES["iid"], p, q, g)
    # Each sibling verified on its own against the parent's p: root children 0, 1, 2 as three chains.
    _, n0, _ = tree_verify(tokens[:, :1], None, draft[:, :1], target[:, :2], g)
    _, n1, _ = tree_verify(tokens[:, 1:2], None, draft[:, 1:2], target[:, [0, 2]], g)
    first = torch.where(n0 > 0, tokens[:, 0], torch.where(n1 > 0, tokens[:, 1], sample(target[:, 0], g)))
    assert chi_square_p_value(torch.bincount(first, minlength=V), p[0]) < P_VALUE_THRESHOLD
