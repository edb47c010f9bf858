"""The speculative sampling rule (Leviathan et al. 2023; Chen et al. 2023), batched, for a
chain of draft tokens and for a tree of them (SpecInfer's multi-candidate rule; Miao et al. 2024).

Notation, fixed for the whole project:
  p  target distribution (after the shared warp), ``target_probs``
  q  draft distribution (after the same warp),    ``draft_probs``
  x_i  the draft token at position i (0-based), drawn from q_i

Rule: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right. At the first
rejection, at position n, emit a token drawn from norm(max(p_n - q_n, 0)). If all K are
accepted, emit a bonus token drawn from p_K. The emitted sequence is distributed exactly as
sampling from p token by token.

Special cases are the same rule, not new code:
  * greedy: p one-hot -> accept iff q_i(x_i) > 0 and x_i == argmax p_i, then emit argmax p_n
    (`greedy_verify` computes exactly that from the argmax ids, without vocabulary-wide tensors);
  * deterministic draft (one-hot q): accept with probability p_i(x_i), resample from p_n
    with x_n removed;
  * padding: a position with q_i(x_i) == 0 is never accepted, and its residual is p_i
    itself. A draft that proposes fewer than K tokens in a row zeroes q past its last one,
    so that row gets the bonus token from p at its own length.
"""

import torch

from specexp.core.sampling import sample
from specexp.core.tree import tree_depths


def tree_verify(
    tree_tokens: torch.Tensor,  # [B, N] long
    # [B, N] long: -1 for a child of the root (the committed tip), else an index < i; None: a chain
    parents: torch.Tensor | None,
    draft_probs: torch.Tensor,  # [B, N, V]: node i's q, given its earlier siblings
    target_probs: torch.Tensor,  # [B, N+1, V]: index 0 is p at the root, index i+1 is p after node i
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a tree of draft tokens per row: returns the accepted path [B, D] (node indices in
    order, -1 padded; D the deepest node's depth), n_accepted [B] and next_token [B].

    At a node whose distribution is r (p there), its children are tried in index order: child c
    is accepted with probability min(1, r(x_c) / q_c(x_c)), and the walk moves to c (r becomes p
    after c); on rejection r <- norm(max(r - q_c, 0)) and the next child is tried. When no child
    is accepted, or the node has none, the next token is drawn from r. Siblings drawn i.i.d. from
    the parent's q pass that q for each; drawn without replacement, q with the earlier siblings
    removed and renormalised; deterministic, one-hot. An all-zero q row is a padding node, never
    accepted, whose rejection leaves r as it was. A chain (``parents`` None: parents[i] = i - 1) takes
    the accepted prefix without the walk, to the bit what the walk gives for the same generator.
    """
    B, N = tree_tokens.shape
    device = tree_tokens.device
    rows = torch.arange(B, device=device)
    order = torch.arange(N, device=device)
    u = torch.rand(B, N, generator=generator, device=device)  # [B, N]: one draw per node, as for a chain
    # p at each node's parent, at its token; q of each node at its token [B, N]
    chain = parents is None or N == 0
    p_x = target_probs[:, :N].gather(-1, tree_tokens[..., None]).squeeze(-1) if chain else \
        target_probs[rows[:, None], parents + 1, tree_tokens]
    q_x = draft_probs.gather(-1, tree_tokens[..., None]).squeeze(-1)
    if chain:  # the walk is the accepted prefix
        # u < p/q, written without division; p >= q always passes since u < 1.
        n_accepted = ((q_x > 0) & (u * q_x < p_x)).long().cumprod(-1).sum(-1)  # [B]
        path = torch.where(order < n_accepted[:, None], order, -1)
        rejected = torch.where(n_accepted < N, n_accepted, -1)
        r = target_probs[rows, n_accepted]
    else:
        path, n_accepted, rejected, r = _walk(tree_tokens, parents, draft_probs, target_probs, u, p_x, q_x)
    # The next token: from r, less the q of a last rejected child not yet taken out of it.
    q_n = draft_probs[rows, rejected.clamp_min(0)] * (rejected >= 0)[:, None] if N else torch.zeros_like(r)
    left = (r - q_n).clamp_min(0)
    # No mass left: the rejection had probability 0, only rounding got here; r is right.
    left = torch.where(left.sum(-1, keepdim=True) > 0, left, r)
    return path, n_accepted, sample(left, generator)


def greedy_verify(
    tree_tokens: torch.Tensor,  # [B, N] long
    parents: torch.Tensor | None,  # [B, N] long as in tree_verify; None: a chain
    draft_probs: torch.Tensor,  # [B, N, V]: q of each node (only q(x) > 0 is read)
    target_ids: torch.Tensor,  # [B, N+1] long: argmax p at the root (0) and after node i (i+1)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`tree_verify` when every p is one-hot (greedy), from p's hot ids: the same path, n_accepted and
    next token (tests/core/test_tree_verify.py checks both agree). With p one-hot at a, a node is accepted
    with probability min(1, p(x) / q(x)) = 1 if x == a and q(x) > 0, else 0; a rejected sibling's
    residual max(p - q, 0) keeps all its mass at a (q(a) < 1 when x != a), so the walk follows the
    first proposed child that is a and the next token is a where it ends. The path is N wide."""
    B, N = tree_tokens.shape
    q_x = draft_probs.gather(-1, tree_tokens[..., None]).squeeze(-1) > 0  # [B, N]: proposed
    order = torch.arange(N, device=tree_tokens.device)
    if parents is None or N == 0:  # a chain: the accepted prefix
        n_accepted = (q_x & (tree_tokens == target_ids[:, :N])).long().cumprod(-1).sum(-1)  # [B]
        path = torch.where(order < n_accepted[:, None], order, -1)
        return path, n_accepted, target_ids.gather(1, n_accepted[:, None]).squeeze(1)
    node = torch.full((B,), -1, dtype=torch.long, device=tree_tokens.device)  # where each row's walk stands
    n_accepted = torch.zeros_like(node)
    path = torch.full((B, N), -1, dtype=torch.long, device=tree_tokens.device)
    for i in range(N):  # parents come before their children
        hot = target_ids.gather(1, (node + 1)[:, None]).squeeze(1)  # [B]: a at the row's node
        accept = (parents[:, i] == node) & q_x[:, i] & (tree_tokens[:, i] == hot)
        path.scatter_(1, n_accepted[:, None],
                      torch.where(accept, i, path.gather(1, n_accepted[:, None])[:, 0])[:, None])
        node = torch.where(accept, i, node)
        n_accepted = n_accepted + accept.long()
    return path, n_accepted, target_ids.gather(1, (node + 1)[:, None]).squeeze(1)


def _walk(tree_tokens: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
          u: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """tree_verify's walk, node by node in index order (a node's children come after it): returns
    the path [B, D], n_accepted [B], a last rejected child whose q is still to be taken out of r
    ([B], -1: none) and r [B, V] (normalised) where each walk ended."""
    B, N = parents.shape
    device = parents.device
    D = int(tree_depths(parents).max())
    # Nodes with a later sibling in some row: their rejection must update r before the sibling is
    # tried. Any other rejection ends its row's walk, and its residual is taken once at the end.
    update_now = (parents[:, :, None] == parents[:, None, :]).triu(1).any(-1).any(0).tolist()  # [N]
    rows = torch.arange(B, device=device)
    node = torch.full((B,), -1, dtype=torch.long, device=device)  # where each row's walk stands
    n_accepted = torch.zeros(B, dtype=torch.long, device=device)
    path = torch.full((B, D), -1, dtype=torch.long, device=device)
    residual = None  # [B, V]: r of rows whose node had a child rejected (when a sibling follows)
    modified = torch.zeros(B, dtype=torch.bool, device=device)  # r is `residual`, not p at the node
    mass = torch.ones(B, device=device)  # r's total: exactly 1 for p itself
    rejected = torch.full((B,), -1, dtype=torch.long, device=device)
    for i in range(N):
        tried = parents[:, i] == node  # [B]: node i is a child of where the row stands
        r_x = p_x[:, i] if residual is None else torch.where(
            modified, residual.gather(1, tree_tokens[:, i : i + 1]).squeeze(1), p_x[:, i])
        accept = tried & (q_x[:, i] > 0) & (u[:, i] * q_x[:, i] * mass < r_x)
        reject = tried & ~accept
        if update_now[i]:  # a later sibling is tried against the residual
            r = target_probs[rows, node + 1] if residual is None else torch.where(
                modified[:, None], residual, target_probs[rows, node + 1])  # [B, V]
            left = (r / mass[:, None] - draft_probs[:, i]).clamp_min(0)
            left_mass = left.sum(-1)
            take = reject & (left_mass > 0)  # no mass left: the rejection had probability 0; keep r
            residual = torch.where(take[:, None], left, r)
            mass = torch.where(take, left_mass, mass)
            modified = modified | take
        else:  # the row's walk ends here; its residual is taken at the end
            rejected = torch.where(reject, i, rejected)
        slot = n_accepted.clamp_max(D - 1)[:, None]
        path.scatter_(1, slot, torch.where(accept[:, None], i, path.gather(1, slot)))
        node = torch.where(accept, i, node)
        n_accepted = n_accepted + accept.long()
        modified, mass = modified & ~accept, torch.where(accept, 1.0, mass)
    r = target_probs[rows, node + 1] if residual is None else torch.where(
        modified[:, None], residual / mass[:, None], target_probs[rows, node + 1])
    return path, n_accepted, rejected, r
