"""A corpus-trained Kneser-Ney n-gram LM as a draft: cheap, and a real (non one-hot) q."""

import numpy as np
import torch

from specexp.core.sampling import SamplingConfig, sample
from specexp.drafts.base import Context, Proposal, warp_distribution
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.ngram.corpus import check_fingerprint
from specexp.ngram.kneser_ney import KneserNeyLM


class NgramLMDrafter:
    """Drafts K tokens from P_KN(. | last order-1 tokens), warped like the target.

    Under greedy decoding the warp makes q one-hot (the argmax continuation); under
    sampling each token is drawn from the warped q that the verifier receives.
    """

    def __init__(self, target: LoadedModel, path: str, k: int = 4):
        if k < 1:
            raise UserInputError(f"draft.k={k} is not allowed; K must be an integer >= 1")
        self.k = k
        self.lm = KneserNeyLM.load(path)
        check_fingerprint(self.lm.fingerprint, target, path)

    def reset(self, ctx: Context) -> None:
        pass  # the LM is fixed; each round reads the committed context

    def propose(self, ctx: Context, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        device, n = ctx.tokens.device, self.lm.order - 1
        tokens, start, lengths = ctx.tokens.cpu(), ctx.start.tolist(), ctx.lengths.tolist()
        contexts = [tokens[b, max(start[b], lengths[b] - n) : lengths[b]].tolist() for b in range(len(start))]
        drafted, probs = [], []
        for _ in range(self.k):
            q = torch.from_numpy(np.stack([self.lm.distribution(c) for c in contexts])).float().to(device)  # [B, V]
            q = warp_distribution(q, sampling)
            x = sample(q, generator)  # [B]
            drafted.append(x)
            probs.append(q)
            contexts = [(c + [t])[-n:] if n else [] for c, t in zip(contexts, x.tolist(), strict=True)]
        drafted_tokens = torch.stack(drafted, 1)  # [B, K]
        return Proposal(tokens=drafted_tokens, probs=torch.stack(probs, 1),
                        n_proposed=torch.full_like(ctx.lengths, self.k))

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass
