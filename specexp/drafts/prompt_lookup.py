"""Prompt lookup decoding (Saxena 2023): copy what followed the last n-gram earlier on.

Matches over the prompt plus everything generated so far, through an incremental n-gram
index per row. The draft is deterministic, so q is one-hot and the shared rule accepts x
with probability p(x) (exactly the greedy rule at temperature 0).

``max_tokens_after_match`` caps how far a short match is followed, because a short match's
tokens are accepted far less often than a long match's and verifying each token costs target
time (docs/lab_notes/code_measurements.md: prompt lookup's match lengths); longer matches
propose K.

With ``branches`` > 1 the draft is a token tree of K nodes: the continuations of up to that
many earlier occurrences that differ (the longest match's first, then shorter matches'), each of
up to K - branches + 1 tokens (or ``depth``), their common prefixes shared; the best one is
followed in full and the rest branch off it while nodes are left.
"""

from collections.abc import Sequence

import numpy as np
import torch

from specexp.core.interface import Context, DraftTraits, Proposal
from specexp.core.sampling import SamplingConfig
from specexp.drafts.parts.base import check_k, committed_tokens, one_hot_proposal, one_hot_tree_proposal, trie
from specexp.drafts.parts.context_index import ContextIndex
from specexp.drafts.parts.dynamic_tree import check_tree
from specexp.errors import UserInputError
from specexp.models import LoadedModel

CHOICES = ("recent", "first", "frequent")
DEFAULT_CAPS = (1, 2)  # most tokens proposed after a match of 1, 2, ... tokens


def check_caps(max_tokens_after_match: Sequence[int], max_n: int) -> tuple[int, ...]:
    caps = tuple(int(cap) for cap in max_tokens_after_match)
    if len(caps) > max_n or any(cap < 0 for cap in caps):
        raise UserInputError(f"draft.max_tokens_after_match={list(caps)} is not allowed; give at most max_n={max_n} "
                             "token counts >= 0 (entry n-1 caps the tokens proposed after an n-token match)")
    return caps


def cap_continuation(continuation: list[int], n: int, caps: Sequence[int], k: int) -> list[int]:
    """The first tokens of a continuation found after an n-token match (n = 0: none found) that
    the caps allow: caps[n-1] for a listed n, k for longer matches."""
    return continuation[: caps[n - 1] if 0 < n <= len(caps) else k]


class PromptLookupDrafter:
    def __init__(self, target: LoadedModel, k: int = 4, max_n: int = 3, min_n: int = 1, choice: str = "first",
                 max_tokens_after_match: Sequence[int] | None = None, branches: int = 1, depth: int | None = None):
        check_k(k)
        check_tree(branches, depth)
        if not 1 <= min_n <= max_n:
            raise UserInputError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if choice not in CHOICES:
            raise UserInputError(f"draft.choice='{choice}' is unknown; allowed: {', '.join(CHOICES)}")
        if max_tokens_after_match is None:
            max_tokens_after_match = DEFAULT_CAPS[:max_n]
        self.caps = check_caps(max_tokens_after_match, max_n)
        self.max_n, self.min_n, self.choice, self.branches, self.depth = max_n, min_n, choice, branches, depth
        # proposals are grouped by match length 0..max_n (draft.k=auto keeps what pays)
        self.traits = DraftTraits(k_max=k, branches=branches, proposal_groups=max_n + 1)
        self.vocab_size = target.vocab_size  # q lives on the target's vocabulary
        self.indexes: list[ContextIndex] = []

    def reset(self, ctx: Context) -> None:
        self.indexes = [ContextIndex(self.max_n, self.min_n) for _ in range(ctx.tokens.shape[0])]
        self.update(ctx, None, None)

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        done = ctx.on_host().done  # matching runs on the host's copy of the tokens: no readback
        if self.branches == 1:
            matches = [(0, []) if done[b] else index.lookup(k, self.choice) for b, index in enumerate(self.indexes)]
            found = [cap_continuation(continuation, n, self.caps, k) for n, continuation in matches]
            proposal = one_hot_proposal(found, self.vocab_size, ctx.tokens.device)
            longest = [n for n, _ in matches]
        else:
            depth = max(k - self.branches + 1, 1)  # the first continuation leaves a node for each other one
            depth = depth if self.depth is None else min(depth, self.depth)
            rows = [[] if done[b] else index.continuations(depth, self.choice, self.branches)
                    for b, index in enumerate(self.indexes)]
            trees = [trie([cap_continuation(c, n, self.caps, k) for n, c in row], k) for row in rows]
            proposal = one_hot_tree_proposal(trees, self.vocab_size, ctx.tokens.device)
            longest = [row[0][0] if row else 0 for row in rows]
        proposal.group_host = np.array(longest, dtype=np.int64)
        proposal.group = torch.from_numpy(proposal.group_host).to(ctx.tokens.device)
        return proposal

    def update(self, ctx: Context, proposal: Proposal | None, n_accepted: torch.Tensor | None) -> None:
        # Index what was committed since the last call; nothing to rewind.
        for index, tokens in zip(self.indexes, committed_tokens(ctx, [len(i) for i in self.indexes]), strict=True):
            index.extend(tokens)
