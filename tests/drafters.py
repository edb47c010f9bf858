"""Test-only drafts: a random one, and a copy of the target (always agrees)."""

import torch

from specexp.core.sampling import SamplingConfig
from specexp.drafts.base import Context, Proposal


class RandomDrafter:
    """Proposes uniformly random tokens with q = uniform: agrees with the target by chance only."""

    def __init__(self, vocab_size: int, k: int):
        self.k, self.vocab_size = k, vocab_size

    def reset(self, ctx: Context) -> None:
        pass

    def propose(self, ctx: Context, sampling: SamplingConfig, generator) -> Proposal:
        B = ctx.tokens.shape[0]
        tokens = torch.randint(self.vocab_size, (B, self.k), generator=generator)
        probs = torch.full((B, self.k, self.vocab_size), 1.0 / self.vocab_size)
        return Proposal(tokens=tokens, probs=probs, n_proposed=torch.full((B,), self.k))

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass
