"""REST-style retrieval drafts (He et al. 2023) from a suffix-array datastore, optionally
combined with the context lookup (take whichever matches longer, like vLLM's suffix method)."""

from collections.abc import Mapping

import numpy as np
import torch

from specexp.core.interface import Context, DraftTraits, Proposal
from specexp.core.sampling import SamplingConfig, sample
from specexp.drafts.parts.base import check_k, check_min_confidence, committed_tokens, stack_proposal, warp_distribution
from specexp.drafts.parts.context_index import ContextIndex
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.ngram.cached import cached_datastore, require_corpus
from specexp.ngram.corpus import check_fingerprint
from specexp.ngram.datastore import SEPARATOR, SuffixDatastore


class RetrievalDrafter:
    def __init__(self, target: LoadedModel, path: str | None = None, k: int = 4, max_match: int = 16,
                 max_occurrences: int = 256, combine_context: bool = True, context_max_n: int = 8,
                 min_confidence: float = 0.0, corpus: Mapping | None = None):
        """path: a datastore from `python -m specexp.ngram datastore`; None builds one of ``corpus``
        (corpus_documents' arguments) once into the cache."""
        check_k(k)
        for name, value in (("max_match", max_match), ("max_occurrences", max_occurrences),
                            ("context_max_n", context_max_n)):
            if value < 1:
                raise UserInputError(f"draft.{name}={value} is not allowed; it must be an integer >= 1")
        check_min_confidence(min_confidence)
        self.min_confidence = min_confidence  # stop when the empirical top probability falls below it
        self.traits = DraftTraits(k_max=k)
        self.max_match, self.max_occurrences = max_match, max_occurrences
        self.combine_context, self.context_max_n = combine_context, context_max_n
        if path is None:
            path = cached_datastore(target, require_corpus(corpus))
        self.store = SuffixDatastore.load(path)
        check_fingerprint(self.store.fingerprint, target, path)
        self.vocab_size = target.vocab_size
        self.indexes: list[ContextIndex] = []

    def reset(self, ctx: Context) -> None:
        self.indexes = [ContextIndex(self.context_max_n, 1) for _ in range(ctx.tokens.shape[0])]
        self.update(ctx, None, None)

    def _walk(self, continuations: np.ndarray, sampling: SamplingConfig, generator, device) -> tuple[list, list]:
        """Draft token by token; q_i = empirical next-token distribution among the occurrences
        that agree with the tokens drafted so far, warped like the target."""
        tokens, probs = [], []
        alive = continuations  # [n, k]
        for i in range(continuations.shape[1]):
            column = alive[:, i]
            column = column[column != SEPARATOR]
            if len(column) == 0:
                break
            counts = torch.from_numpy(np.bincount(column, minlength=self.vocab_size)).float().to(device)
            if counts.max() < self.min_confidence * counts.sum():
                break
            q = warp_distribution(counts / counts.sum(), sampling)  # [V]
            x = int(sample(q, generator))
            tokens.append(x)
            probs.append(q)
            alive = alive[alive[:, i] == x]
        return tokens, probs

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        device, done = ctx.tokens.device, ctx.on_host().done
        all_tokens, all_probs = [], []
        for b, index in enumerate(self.indexes):
            tokens, probs = [], []
            if not done[b]:
                m, positions = self.store.longest_match(index.tokens, self.max_match)
                n_ctx, from_context = index.lookup(k) if self.combine_context else (0, [])
                if n_ctx > m:  # the context matches longer: a deterministic (one-hot) proposal
                    tokens = from_context
                    probs = list(torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab_size).float().to(device))
                elif m > 0:
                    continuations = self.store.continuations(positions[: self.max_occurrences], m, k)
                    tokens, probs = self._walk(continuations, sampling, generator, device)
            all_tokens.append(tokens)
            all_probs.append(probs)
        return stack_proposal(all_tokens, all_probs, self.vocab_size, device)

    def update(self, ctx: Context, proposal: Proposal | None, n_accepted: torch.Tensor | None) -> None:
        for index, tokens in zip(self.indexes, committed_tokens(ctx, [len(i) for i in self.indexes]), strict=True):
            index.extend(tokens)
