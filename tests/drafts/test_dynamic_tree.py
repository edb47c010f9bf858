"""EAGLE-2-style dynamic token trees (drafts/parts/dynamic_tree.py) and the small-LM and n-gram drafts
that grow them: level sizes, sibling draws, the draft's own tree cache, bad arguments. End-to-end
exactness of every tree draft (greedy K = 1..8, B = 1, 3; sampled chi-square) is in test_engine
and test_exactness, which take them from tests.drafters.DRAFT_KINDS."""

import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.ngram_lm import NgramLMDrafter
from specexp.drafts.parts.dynamic_tree import draw_children, level_sizes
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError

GREEDY = SamplingConfig()


@pytest.mark.parametrize(("branches", "nodes", "depth", "levels"), [
    (1, 4, None, [[1], [1], [1], [1]]),  # a chain
    (2, 6, None, [[2], [2, 2]]),
    (2, 16, None, [[2], [2, 2], [2, 2], [2, 2], [2]]),
    (3, 10, 2, [[3], [3, 3, 1]]),  # the budget ends inside a level: the last expanded node gets what is left
    (3, 20, 2, [[3], [3, 3, 3]]),  # the depth ends the tree first
    (4, 3, None, [[3]]),
])
def test_level_sizes_spend_the_budget_best_node_first(branches, nodes, depth, levels):
    assert level_sizes(branches, nodes, depth) == levels
    assert sum(map(sum, levels)) == min(nodes, sum(map(sum, level_sizes(branches, 10**3, depth))))


def test_sampled_siblings_are_drawn_without_replacement_with_their_renormalised_q():
    q = torch.tensor([[[0.5, 0.3, 0.2, 0.0]]]).expand(4000, 1, 4)  # [B, e, V]
    tokens, probs, raw = draw_children(q, q, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert bool((tokens[:, 0, 0] != tokens[:, 0, 1]).all()) and bool((tokens[:, 0, 1] != tokens[:, 0, 2]).all())
    torch.testing.assert_close(probs[:, 0, 0], q[:, 0])
    first = tokens[:, 0, 0]
    second = q[:, 0].scatter(-1, first[:, None], 0.0)
    torch.testing.assert_close(probs[:, 0, 1], second / second.sum(-1, keepdim=True))
    assert float(probs[:, 0, 3].abs().sum()) == 0.0  # three tokens carry mass: the fourth child is padding
    assert abs(float((first == 0).float().mean()) - 0.5) < 0.04  # the first child follows q
    torch.testing.assert_close(raw, q.gather(-1, tokens))


def test_greedy_children_are_the_top_tokens_one_hot():
    raw = torch.tensor([[[0.1, 0.6, 0.3]]])
    tokens, probs, _ = draw_children(raw, raw, 2, GREEDY, None)
    assert tokens[0, 0].tolist() == [1, 2]
    assert probs[0, 0].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


@torch.no_grad()
def _ranks_of_draft(draft_model, committed: list[int], path: list[int], token: int) -> int:
    """Rank of ``token`` among the draft model's next-token logits after committed + path."""
    logits = draft_model(torch.tensor([committed + path])).logits[0, -1]
    return int((logits > logits[token]).sum())


@pytest.mark.parametrize("branches", [2, 3])
def test_small_lm_tree_nodes_are_the_drafts_top_children_of_their_paths(target, other_draft, prompts, branches):
    """Through ragged rounds (rows accepting different paths, the draft cache moving the accepted
    path's entries into place), node j of a parent is the draft's j-th most likely token after the
    node's root-to-node path: the draft's tree-masked cache equals a fresh forward of every path."""
    drafter = SmallLMDrafter(target, other_draft, k=7, branches=branches)
    propose, checked = drafter.propose, []

    def checking_propose(ctx, k, sampling, generator):
        proposal = propose(ctx, k, sampling, generator)
        for b in range(len(prompts)):
            committed = ctx.tokens[b, ctx.start[b] : ctx.lengths[b]].tolist()
            tokens, parents = proposal.tokens[b].tolist(), proposal.parents[b].tolist()
            for i, token in enumerate(tokens):
                path, j = [], parents[i]
                while j >= 0:
                    path, j = [tokens[j]] + path, parents[j]
                rank = sum(parents[s] == parents[i] for s in range(i))  # earlier siblings
                assert _ranks_of_draft(other_draft.model, committed, path, token) == rank
                checked.append(i)
        return proposal

    drafter.propose = checking_propose
    out = generate(target.model, prompts, drafter, GREEDY, 16, [10**6], torch.Generator().manual_seed(0))
    assert len(out.tokens[0]) == 16 and max(checked) == 6
    assert len(set(out.n_accepted[:3].flatten().tolist())) > 1  # rows took different paths


def test_tree_drafts_propose_k_nodes_with_parents(target, other_draft, ngram_files, prompts):
    """A budget of 8 nodes at 2 branches: 8 nodes a round, each hanging under an earlier node or the root,
    at most 2 children under any node, no path deeper than 3 ([[2], [2, 2], [2]])."""
    for drafter in (SmallLMDrafter(target, other_draft, k=8, branches=2), NgramLMDrafter(target, ngram_files["lm"], k=8,
                                                                                        branches=2)):
        propose, trees = drafter.propose, []
        drafter.propose = lambda *args, propose=propose, trees=trees: trees.append(propose(*args)) or trees[-1]
        out = generate(target.model, prompts, drafter, SamplingConfig(temperature=1.0), 12, [10**6],
                       torch.Generator().manual_seed(0))
        assert int(out.n_proposed.max()) == 8 and int(out.n_accepted.max()) <= 3
        assert trees and all(proposal.parents is not None for proposal in trees)
        for proposal in trees:
            for b in range(proposal.tokens.shape[0]):
                parents = proposal.parents[b, : int(proposal.n_proposed[b])].tolist()
                assert all(-1 <= parent < i for i, parent in enumerate(parents))
                assert max(parents.count(node) for node in range(-1, len(parents))) <= 2
                depth = [0] * len(parents)
                for i, parent in enumerate(parents):
                    depth[i] = 1 if parent < 0 else depth[parent] + 1
                assert max(depth, default=0) <= 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k": 4, "branches": 0}, "draft.branches=0 is not allowed"),
    ({"k": 4, "branches": 2, "depth": 0}, "draft.depth=0 is not allowed"),
    ({"k": 4, "branches": 2, "min_confidence": 0.3}, "draft.min_confidence=0.3 stops chains"),
])
def test_bad_tree_arguments_are_refused(target, other_draft, ngram_files, kwargs, message):
    with pytest.raises(UserInputError, match=message):
        SmallLMDrafter(target, other_draft, **kwargs)
    with pytest.raises(UserInputError, match=message):
        NgramLMDrafter(target, ngram_files["lm"], **kwargs)
