"""A corpus-trained Kneser-Ney n-gram LM as a draft: cheap, and a real (non one-hot) q."""

from collections.abc import Mapping

import numpy as np
import torch

from specexp.core.interface import Context, Proposal
from specexp.core.sampling import SamplingConfig, sample
from specexp.drafts.base import check_k, check_min_confidence, warp_distribution
from specexp.models import LoadedModel
from specexp.ngram.cached import cached_lm, require_corpus
from specexp.ngram.corpus import check_fingerprint
from specexp.ngram.kneser_ney import KneserNeyLM


class NgramLMDrafter:
    """Drafts K tokens from P_KN(. | last order-1 tokens), warped like the target.

    Under greedy decoding the warp makes q one-hot (the argmax continuation); under
    sampling each token is drawn from the warped q that the verifier receives. A row stops
    drafting once the LM's own top probability falls below ``min_confidence``: an
    adaptive draft length decided before verification, so exactness is untouched.
    """

    def __init__(self, target: LoadedModel, path: str | None = None, k: int = 4, min_confidence: float = 0.0,
                 order: int = 5, corpus: Mapping | None = None):
        """path: an LM file from `python -m specexp.ngram lm`; None builds an order-``order`` LM of
        ``corpus`` (corpus_documents' arguments) once into the cache."""
        check_k(k)
        check_min_confidence(min_confidence)
        self.k, self.min_confidence = k, min_confidence
        if path is None:
            path = cached_lm(target, order, require_corpus(corpus))
        self.lm = KneserNeyLM.load(path)
        check_fingerprint(self.lm.fingerprint, target, path)

    def reset(self, ctx: Context) -> None:
        pass  # the LM is fixed; each round reads the committed context

    def propose(self, ctx: Context, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        device, n = ctx.tokens.device, self.lm.order - 1
        tokens, start, lengths = ctx.tokens.cpu(), ctx.start.tolist(), ctx.lengths.tolist()
        contexts = [tokens[b, max(start[b], lengths[b] - n) : lengths[b]].tolist() for b in range(len(start))]
        drafted, probs = [], []
        confident = ~ctx.done  # [B]: rows still drafting
        n_proposed = torch.zeros_like(ctx.lengths)
        for _ in range(self.k):
            q_raw = torch.from_numpy(np.stack([self.lm.distribution(c) for c in contexts])).float().to(device)  # [B, V]
            confident = confident & (q_raw.max(-1).values >= self.min_confidence)
            if not bool(confident.any()):
                break
            q = warp_distribution(q_raw, sampling) * confident[:, None]  # zero q = not proposed
            x = sample(q.clamp_min(0) + (~confident)[:, None], generator)  # [B]; any token for stopped rows
            drafted.append(x)
            probs.append(q)
            n_proposed = n_proposed + confident.long()
            contexts = [(c + [t])[-n:] if n else [] for c, t in zip(contexts, x.tolist(), strict=True)]
        if not drafted:
            return Proposal.empty(len(contexts), self.lm.vocab_size, device)
        return Proposal(tokens=torch.stack(drafted, 1), probs=torch.stack(probs, 1), n_proposed=n_proposed)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass
