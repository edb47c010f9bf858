"""Helpers the draft strategies share: argument checks, turning per-row token lists into a
Proposal, the shared warp for drafts that output probabilities. The contract itself (Context,
Proposal, Drafter, SharesTargetPass) lives in specexp.core.interface."""

import numpy as np
import torch

from specexp.core.interface import Context, Proposal
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.errors import UserInputError


def committed_tokens(ctx: Context, already_seen: list[int]) -> list[list[int]]:
    """Per row, the committed tokens after the first ``already_seen[b]`` (host lists, from the host's copy)."""
    host = ctx.on_host()
    return [host.committed(b, seen) for b, seen in enumerate(already_seen)]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def check_k(k: int) -> None:
    if k < 1:
        raise UserInputError(f"draft.k={k} is not allowed; "
                             f"K must be an integer >= 1 (or 0: never propose, the A/A control)")


def check_min_confidence(min_confidence: float) -> None:
    if not 0.0 <= min_confidence < 1.0:
        raise UserInputError(f"draft.min_confidence={min_confidence} is outside [0, 1)")


def _pad_rows(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Per-row token lists (any lengths) -> tokens [B, K] (zero-padded) and n_proposed [B], on the
    device, and n_proposed on the host."""
    B, K = len(rows), max((len(r) for r in rows), default=0)
    tokens = np.zeros((B, K), dtype=np.int64)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    return torch.from_numpy(tokens).to(device), torch.from_numpy(counts).to(device), counts


def one_hot_proposal(found: list[list[int]], vocab_size: int, device: torch.device) -> Proposal:
    """A deterministic draft's proposal: per-row token lists (any lengths) -> padded tokens, one-hot q."""
    tokens, n_proposed, counts = _pad_rows(found, device)
    valid = torch.arange(tokens.shape[1], device=device)[None, :] < n_proposed[:, None]  # [B, K]
    probs = torch.zeros(*tokens.shape, vocab_size, device=device).scatter_(2, tokens[..., None],
                                                                           valid[..., None].float())  # [B, K, V]
    return Proposal(tokens=tokens, probs=probs, n_proposed=n_proposed, n_proposed_host=counts)


def warp_distribution(q: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Apply the shared warp to a draft that outputs probabilities [..., V] (log q as logits)."""
    return logits_to_probs(q.log(), sampling)


def stack_proposal(tokens: list[list[int]], probs: list[list[torch.Tensor]], vocab_size: int,
                   device: torch.device) -> Proposal:
    """Per-row drafted tokens and their q rows [V] (any lengths) -> a padded Proposal."""
    drafted, n_proposed, counts = _pad_rows(tokens, device)
    q = torch.zeros(*drafted.shape, vocab_size, device=device)
    for b, row_probs in enumerate(probs):
        if row_probs:
            q[b, : len(row_probs)] = torch.stack(row_probs)
    return Proposal(tokens=drafted, probs=q, n_proposed=n_proposed, n_proposed_host=counts)


def trie(continuations: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """Continuations of a row, best first -> a token tree of at most ``budget`` nodes (tokens,
    parents; -1: under the tip) that shares their common prefixes: the first is followed as far
    as the budget allows, the others branch off it where they differ. Nodes come in the order
    they are created, so a parent always precedes its children."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for continuation in continuations:
        parent = -1
        for token in continuation:
            node = child.get((parent, token))
            if node is None:
                if len(tokens) == budget:
                    break
                node = child[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = node
    return tokens, parents


def one_hot_tree_proposal(trees: list[tuple[list[int], list[int]]], vocab_size: int, device: torch.device) -> Proposal:
    """A deterministic draft's token trees, per row (tokens, parents) of any sizes -> a Proposal with
    parents; a row's padding nodes (past its own count) hang under the tip with q all zero.
    Siblings are distinct tokens, each proposed with certainty: q one-hot (core/verify.py)."""
    proposal = one_hot_proposal([tokens for tokens, _ in trees], vocab_size, device)
    parents = np.full(tuple(proposal.tokens.shape), -1, dtype=np.int64)
    for b, (_, row_parents) in enumerate(trees):
        parents[b, : len(row_parents)] = row_parents
    proposal.parents = torch.from_numpy(parents).to(device)
    return proposal
