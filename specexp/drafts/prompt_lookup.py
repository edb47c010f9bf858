"""Prompt lookup decoding (Saxena 2023): copy what followed the last n-gram earlier on.

The draft is deterministic, so q is one-hot and the shared rule accepts x with
probability p(x) (exactly the greedy rule at temperature 0).
"""

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from specexp.core.sampling import SamplingConfig
from specexp.drafts.base import Context, Proposal
from specexp.errors import UserInputError
from specexp.models import LoadedModel


def lookup_continuation(seq: np.ndarray, max_n: int, min_n: int, k: int) -> np.ndarray:
    """Tokens that followed the most recent earlier match of seq's last n-gram, n = max_n..min_n.

    Returns up to k tokens (fewer when the continuation reaches the end of seq; none when
    nothing matches).
    """
    L = len(seq)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        pattern = seq[L - n :]
        windows = sliding_window_view(seq[: L - 1], n)  # [L-n, n]: starts that leave a continuation
        hits = np.flatnonzero((windows == pattern).all(1))
        if len(hits):
            start = hits[-1] + n
            return seq[start : start + k]
    return seq[:0]


class PromptLookupDrafter:
    def __init__(self, target: LoadedModel, k: int = 4, max_n: int = 3, min_n: int = 1):
        if k < 1:
            raise UserInputError(f"draft.k={k} is not allowed; K must be an integer >= 1")
        if not 1 <= min_n <= max_n:
            raise UserInputError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.k, self.max_n, self.min_n = k, max_n, min_n
        self.vocab_size = target.vocab_size  # q lives on the target's vocabulary

    def reset(self, ctx: Context) -> None:
        pass  # stateless: every round looks at the committed context afresh

    def propose(self, ctx: Context, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        tokens = ctx.tokens.cpu().numpy()
        start, lengths, done = ctx.start.tolist(), ctx.lengths.tolist(), ctx.done.tolist()
        found = [
            lookup_continuation(tokens[b, start[b] : lengths[b]], self.max_n, self.min_n, self.k)
            if not done[b] else tokens[b, :0]
            for b in range(len(start))
        ]
        B, K = len(found), max(len(f) for f in found)
        drafted = torch.zeros(B, K, dtype=torch.long)
        n_proposed = torch.tensor([len(f) for f in found], dtype=torch.long)
        for b, f in enumerate(found):
            drafted[b, : len(f)] = torch.from_numpy(f)
        valid = torch.arange(K)[None, :] < n_proposed[:, None]  # [B, K]
        probs = torch.nn.functional.one_hot(drafted, self.vocab_size).float() * valid[..., None]  # [B, K, V]
        device = ctx.tokens.device
        return Proposal(tokens=drafted.to(device), probs=probs.to(device), n_proposed=n_proposed.to(device))

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass  # nothing to rewind: the next lookup reads the committed context
