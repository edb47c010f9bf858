"""The one interface every draft strategy implements, and the data it sees and returns."""

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specexp.core.kv import RaggedKV
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.errors import UserInputError


@dataclass
class Context:
    """The committed tokens of a batch, as the engine keeps them.

    Row b holds ``tokens[b, start[b]:lengths[b]]``: its left-padded prompt, then everything
    committed so far. Slots past ``lengths[b]`` are scratch.
    """

    tokens: torch.Tensor  # [B, S] long
    start: torch.Tensor  # [B] long: first non-padding slot
    lengths: torch.Tensor  # [B] long: end (exclusive) of the committed tokens
    done: torch.Tensor  # [B] bool: row finished (EOS or max_new_tokens)


@dataclass
class Proposal:
    """What a draft hands the verifier for one round.

    A row may propose fewer than K tokens: past its own count its tokens are arbitrary and
    its q rows are all zero, which the verifier treats as "rejected, resample from p".
    """

    tokens: torch.Tensor  # [B, K] long
    probs: torch.Tensor  # [B, K, V]: q, one-hot for deterministic drafts
    n_proposed: torch.Tensor  # [B] long in 0..K

    @classmethod
    def empty(cls, batch_size: int, vocab_size: int, device: torch.device) -> "Proposal":
        return cls(
            tokens=torch.zeros(batch_size, 0, dtype=torch.long, device=device),
            probs=torch.zeros(batch_size, 0, vocab_size, device=device),
            n_proposed=torch.zeros(batch_size, dtype=torch.long, device=device),
        )


@runtime_checkable
class Drafter(Protocol):
    """A draft strategy. The engine calls, per batch: reset, then per round propose -> update."""

    k: int  # most tokens proposed per round

    def reset(self, ctx: Context) -> None:
        """Start a new batch of prompts (drop all per-sequence state, prefill caches)."""

    def propose(self, ctx: Context, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        """Propose up to k tokens per row, with the distribution q each was drawn from."""

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        """Learn what was accepted ([B] long) and rewind own state to the committed tip.

        ``ctx`` already holds the tokens committed this round.
        """


@runtime_checkable
class SharesTargetPass(Protocol):
    """A draft made of the target's own first layers (early exit, shared mode).

    It writes those layers' KV for the positions it drafts from into the target's cache, so it
    runs the round's target pass itself and computes only what drafting left out.
    """

    def attach(self, kv: RaggedKV) -> None:
        """Take the target's cache (after the prompt pass, before reset)."""

    def target_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Append [tip, x_1..x_K] ([B, K+1]) to the target's cache; return its logits [B, K+1, V]."""


def committed_tokens(ctx: Context, already_seen: list[int]) -> list[list[int]]:
    """Per row, the committed tokens after the first ``already_seen[b]`` (host lists)."""
    tokens, start, lengths = ctx.tokens.cpu(), ctx.start.tolist(), ctx.lengths.tolist()
    return [tokens[b, start[b] + seen : lengths[b]].tolist() for b, seen in enumerate(already_seen)]


def check_k(k: int) -> None:
    if k < 1:
        raise UserInputError(f"draft.k={k} is not allowed; K must be an integer >= 1")


def check_min_confidence(min_confidence: float) -> None:
    if not 0.0 <= min_confidence < 1.0:
        raise UserInputError(f"draft.min_confidence={min_confidence} is outside [0, 1)")


def _pad_rows(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row token lists (any lengths) -> tokens [B, K] (zero-padded) and n_proposed [B]."""
    B, K = len(rows), max((len(r) for r in rows), default=0)
    tokens = torch.zeros(B, K, dtype=torch.long)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens.to(device), torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)


def one_hot_proposal(found: list[list[int]], vocab_size: int, device: torch.device) -> Proposal:
    """A deterministic draft's proposal: per-row token lists (any lengths) -> padded tokens, one-hot q."""
    tokens, n_proposed = _pad_rows(found, device)
    valid = torch.arange(tokens.shape[1], device=device)[None, :] < n_proposed[:, None]  # [B, K]
    probs = torch.zeros(*tokens.shape, vocab_size, device=device).scatter_(2, tokens[..., None],
                                                                           valid[..., None].float())  # [B, K, V]
    return Proposal(tokens=tokens, probs=probs, n_proposed=n_proposed)


def warp_distribution(q: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Apply the shared warp to a draft that outputs probabilities [..., V] (log q as logits)."""
    return logits_to_probs(q.log(), sampling)


def stack_proposal(tokens: list[list[int]], probs: list[list[torch.Tensor]], vocab_size: int,
                   device: torch.device) -> Proposal:
    """Per-row drafted tokens and their q rows [V] (any lengths) -> a padded Proposal."""
    drafted, n_proposed = _pad_rows(tokens, device)
    q = torch.zeros(*drafted.shape, vocab_size, device=device)
    for b, row_probs in enumerate(probs):
        if row_probs:
            q[b, : len(row_probs)] = torch.stack(row_probs)
    return Proposal(tokens=drafted, probs=q, n_proposed=n_proposed)
