"""Token trees as the engine passes them: node i of a row's tree has a parent (-1: the committed
tip, else an earlier node), so a chain is the tree whose node i hangs under node i - 1."""

import torch


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node [B, N] long (1 for a child of the root) from its parent (-1: the root,
    else an index < its own)."""
    depth = torch.zeros_like(parents)
    for i in range(parents.shape[1]):
        parent = parents[:, i]
        above = depth.gather(1, parent.clamp_min(0)[:, None]).squeeze(1)  # [B]
        depth[:, i] = torch.where(parent < 0, 1, above + 1)
    return depth


def chain_parents(batch_size: int, n: int, device: torch.device) -> torch.Tensor:
    """The tree of a chain: node i's parent is node i - 1 [B, n]."""
    return (torch.arange(n, device=device) - 1).expand(batch_size, n)


def tree_mask(parents: torch.Tensor) -> torch.Tensor:
    """Which slots of a tree block each of its queries sees [B, N+1, N+1] bool, from the nodes'
    parents [B, N]: slot 0 is the tip (the parent -1 stands for), slot i+1 node i; each sees the
    tip, its ancestors and itself."""
    B, N = parents.shape
    rows = torch.arange(B, device=parents.device)
    seen = torch.eye(N + 1, dtype=torch.bool, device=parents.device).repeat(B, 1, 1)
    seen[:, :, 0] = True
    for i in range(N):
        seen[:, i + 1] |= seen[rows, parents[:, i] + 1]
    return seen


def tree_positions(n_valid: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Position ids of a tree block [B, N+1]: the tip at the row's next position, a node at the tip's plus its depth."""
    depth = torch.cat([torch.zeros_like(parents[:, :1]), tree_depths(parents)], dim=1)
    return n_valid[:, None] + depth


def proposal_depth(tokens: torch.Tensor, probs: torch.Tensor, n_proposed: torch.Tensor,
                   parents: torch.Tensor | None) -> torch.Tensor:
    """Depth of each row's proposal [B]: a chain's is its length; a tree's, its deepest node that
    is proposed (q of its own token > 0; padding nodes have none)."""
    if parents is None or not parents.shape[1]:
        return n_proposed
    proposed = probs.gather(2, tokens[..., None]).squeeze(2) > 0  # [B, N]
    return torch.where(proposed, tree_depths(parents), 0).max(1).values
