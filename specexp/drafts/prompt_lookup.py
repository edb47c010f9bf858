"""Prompt lookup decoding (Saxena 2023): copy what followed the last n-gram earlier on.

Matches over the prompt plus everything generated so far, through an incremental n-gram
index per row. The draft is deterministic, so q is one-hot and the shared rule accepts x
with probability p(x) (exactly the greedy rule at temperature 0).
"""

import torch

from specexp.core.sampling import SamplingConfig
from specexp.drafts.base import Context, Proposal, check_k, committed_tokens, one_hot_proposal
from specexp.drafts.context_index import ContextIndex
from specexp.errors import UserInputError
from specexp.models import LoadedModel

CHOICES = ("recent", "first", "frequent")


class PromptLookupDrafter:
    def __init__(self, target: LoadedModel, k: int = 4, max_n: int = 3, min_n: int = 1, choice: str = "recent"):
        check_k(k)
        if not 1 <= min_n <= max_n:
            raise UserInputError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if choice not in CHOICES:
            raise UserInputError(f"draft.choice='{choice}' is unknown; allowed: {', '.join(CHOICES)}")
        self.k, self.max_n, self.min_n, self.choice = k, max_n, min_n, choice
        self.vocab_size = target.vocab_size  # q lives on the target's vocabulary
        self.indexes: list[ContextIndex] = []

    def reset(self, ctx: Context) -> None:
        self.indexes = [ContextIndex(self.max_n, self.min_n) for _ in range(ctx.tokens.shape[0])]
        self.update(ctx, None, None)

    def propose(self, ctx: Context, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        done = ctx.done.tolist()
        found = [[] if done[b] else index.lookup(self.k, self.choice)[1] for b, index in enumerate(self.indexes)]
        return one_hot_proposal(found, self.vocab_size, ctx.tokens.device)

    def update(self, ctx: Context, proposal: Proposal | None, n_accepted: torch.Tensor | None) -> None:
        # Index what was committed since the last call; nothing to rewind.
        for index, tokens in zip(self.indexes, committed_tokens(ctx, [len(i) for i in self.indexes]), strict=True):
            index.extend(tokens)
