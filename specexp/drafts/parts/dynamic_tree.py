"""EAGLE-2-style dynamic token trees for drafts that output a distribution (Li et al. 2024).

The tree grows a level at a time: the root's ``branches`` most likely (greedy) or sampled
(without replacement) children first; then, per level, the ``branches`` nodes of highest
cumulative draft probability are expanded, ``branches`` children each, until the node budget or
the depth cap is reached. Every expansion is one draft step over the expanded nodes.

Exactness (core/verify.tree_verify) asks that a node's children be drawn one after another from
the q's handed to the verifier, and that how many children a node gets be fixed before they are
drawn. Both hold here: the number of children depends only on scores of levels already drawn
(the budget is spent in rank order, so the last expanded node may get fewer), and no node is
pruned afterwards (EAGLE-2's final re-ranking would drop a drawn sibling by its own value, which
biases sampled output). Under greedy decoding the children are the top tokens with one-hot q, a
deterministic draft, exact for any shape.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specexp.core.sampling import SamplingConfig, sample
from specexp.errors import UserInputError

# (expanded node ids [B, e], their tokens [B, e], their parents [B, e], their depth) ->
# (untempered draft probabilities [B, e, V], warped q [B, e, V]) after each of them
Expand = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [B, N] long, parents before children, siblings in draw order
    parents: torch.Tensor  # [B, N] long: -1 under the committed tip
    probs: torch.Tensor  # [B, N, V]: q of each node given its earlier siblings; zero = padding


def check_tree(branches: int, depth: int | None, min_confidence: float = 0.0) -> None:
    """A tree of K nodes takes at most ``branches`` children per node (fewer where K is smaller)."""
    if branches < 1:
        raise UserInputError(f"draft.branches={branches} is not allowed; give 1 (a chain) or more (a token tree)")
    if depth is not None and depth < 1:
        raise UserInputError(f"draft.depth={depth} is not allowed; give null (as deep as draft.k allows) or >= 1")
    if branches > 1 and min_confidence > 0.0:
        raise UserInputError(f"draft.min_confidence={min_confidence} stops chains; a token tree "
                             f"(draft.branches={branches}) takes 0.0")


def level_sizes(branches: int, n_nodes: int, depth: int | None) -> list[list[int]]:
    """Children per expanded node, level by level: [[c_root]], then one list per later level (one
    count per expanded node, best first) while the budget ``n_nodes`` and ``depth`` allow."""
    levels = [[min(branches, n_nodes)]]
    left, frontier = n_nodes - levels[0][0], levels[0][0]
    while left > 0 and (depth is None or len(levels) < depth):
        n_expand = min(branches, frontier, math.ceil(left / branches))
        counts = [branches] * n_expand
        counts[-1] -= branches * n_expand - min(left, branches * n_expand)
        levels.append(counts)
        left, frontier = left - sum(counts), sum(counts)
    return levels


def draw_children(raw: torch.Tensor, q: torch.Tensor, n: int, sampling: SamplingConfig,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` children of each of e nodes from raw [B, e, V] and q [B, e, V] -> tokens [B, e, n], their
    q's [B, e, n, V] (given the earlier siblings; zero once q has no mass left: padding) and raw
    probabilities [B, e, n]. Greedy: the n most likely tokens, one-hot; sampled: without replacement."""
    if sampling.greedy:
        top = raw.topk(n, dim=-1)
        valid = top.values > 0  # [B, e, n]
        probs = torch.zeros(*top.indices.shape, raw.shape[-1], device=raw.device)
        probs.scatter_(-1, top.indices[..., None], valid[..., None].float())
        return top.indices, probs, top.values
    left = q.clone()
    tokens, probs = [], []
    for _ in range(n):
        mass = left.sum(-1, keepdim=True)  # [B, e, 1]
        has_mass = mass > 0
        x = sample(torch.where(has_mass, left, 1.0), generator)  # [B, e]; any token where none is left
        probs.append(torch.where(has_mass, left / mass.clamp_min(1e-30), 0.0))
        tokens.append(x)
        left.scatter_(-1, x[..., None], 0.0)
    tokens = torch.stack(tokens, -1)
    return tokens, torch.stack(probs, 2), raw.gather(-1, tokens)


class TreeRegion:
    """A draft cache's entries for a growing tree, a level per draft step: which earlier entries
    each new one sees (its ancestors') and each node's entry index (-1 before it is fed)."""

    def __init__(self, batch_size: int, n_nodes: int, device: torch.device):
        self.seen = torch.zeros(batch_size, 0, 0, dtype=torch.bool, device=device)  # [B, F, F]
        self.slots = torch.full((batch_size, n_nodes), -1, dtype=torch.long, device=device)  # [B, N]

    @property
    def n_fed(self) -> int:
        return self.seen.shape[1]

    def add(self, nodes: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Feed the expanded ``nodes`` [B, e] (their ``parents`` [B, e], -1 under the tip): returns
        what their entries see within the region [B, e, F+e] (their ancestors' and their own)."""
        B, F, e, device = nodes.shape[0], self.n_fed, nodes.shape[1], nodes.device
        parent_entry = self.slots.gather(1, parents.clamp_min(0)).clamp_min(0)  # [B, e]
        above = self.seen.gather(1, parent_entry[..., None].expand(-1, -1, F))
        above = above & (parents >= 0)[..., None]  # [B, e, F]: a root child sees no fed node
        self.seen = torch.cat([torch.cat([self.seen, torch.zeros(B, F, e, dtype=torch.bool, device=device)], 2),
                               torch.cat([above, torch.eye(e, dtype=torch.bool, device=device).expand(B, -1, -1)], 2)],
                              1)
        self.slots.scatter_(1, nodes, F + torch.arange(e, device=device).expand(B, -1))
        return self.seen[:, F:]


def grow_tree(root_raw: torch.Tensor, root_q: torch.Tensor, expand: Expand, branches: int, n_nodes: int,
              depth: int | None, sampling: SamplingConfig, generator: torch.Generator | None) -> DraftTree:
    """A dynamic token tree of at most ``n_nodes`` nodes from the root's distributions [B, V]."""
    B, device = root_raw.shape[0], root_raw.device
    levels = level_sizes(branches, n_nodes, depth)
    tokens, probs, raw = draw_children(root_raw[:, None], root_q[:, None], levels[0][0], sampling, generator)
    tokens, probs = tokens[:, 0], probs[:, 0]  # [B, c], [B, c, V]
    parents = torch.full_like(tokens, -1)
    valid = probs.sum(-1) > 0  # [B, c]
    score = torch.where(valid, raw[:, 0].clamp_min(1e-30).log(), -math.inf)  # cumulative log draft probability
    frontier = torch.arange(tokens.shape[1], device=device).expand(B, -1)  # [B, f]: the last level's nodes
    for level, counts in enumerate(levels[1:], start=2):
        e = len(counts)
        best = score.gather(1, frontier).topk(e, dim=1).indices  # [B, e], best first (ties: lower index)
        nodes = frontier.gather(1, best)
        level_raw, level_q = expand(nodes, tokens.gather(1, nodes), parents.gather(1, nodes), level - 1)
        c_tokens, c_probs, c_raw = draw_children(level_raw, level_q, counts[0], sampling, generator)
        keep = [(i, j) for i, count in enumerate(counts) for j in range(count)]  # best parent's children first
        which, child = (torch.tensor([i for i, _ in keep], device=device),
                        torch.tensor([j for _, j in keep], device=device))
        c_parents = nodes[:, which]  # [B, m]
        c_valid = (c_probs[:, which, child].sum(-1) > 0) & valid.gather(1, c_parents)
        c_score = score.gather(1, c_parents) + c_raw[:, which, child].clamp_min(1e-30).log()
        n_before = tokens.shape[1]
        tokens = torch.cat([tokens, c_tokens[:, which, child]], 1)
        probs = torch.cat([probs, c_probs[:, which, child] * c_valid[..., None]], 1)
        parents = torch.cat([parents, c_parents], 1)
        valid = torch.cat([valid, c_valid], 1)
        score = torch.cat([score, torch.where(c_valid, c_score, -math.inf)], 1)
        frontier = torch.arange(n_before, tokens.shape[1], device=device).expand(B, -1)
    return DraftTree(tokens=tokens, parents=parents, probs=probs)
