"""A corpus-trained Kneser-Ney n-gram LM as a draft: cheap, and a real (non one-hot) q."""

from collections.abc import Mapping

import numpy as np
import torch

from specexp.core.interface import Context, DraftTraits, Proposal
from specexp.core.sampling import SamplingConfig, sample
from specexp.drafts.parts.base import check_k, check_min_confidence, warp_distribution
from specexp.drafts.parts.dynamic_tree import check_tree, grow_tree
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

    ``branches`` > 1 drafts a dynamic tree of K nodes instead (`drafts/parts/dynamic_tree.py`): the top
    (greedy) or sampled-without-replacement continuations of the most probable nodes, level by level.
    """

    def __init__(self, target: LoadedModel, path: str | None = None, k: int = 4, min_confidence: float = 0.0,
                 order: int = 5, corpus: Mapping | None = None, branches: int = 1, depth: int | None = None):
        """path: an LM file from `python -m specexp.ngram lm`; None builds an order-``order`` LM of
        ``corpus`` (corpus_documents' arguments) once into the cache."""
        check_k(k)
        check_min_confidence(min_confidence)
        check_tree(branches, depth, min_confidence)
        self.traits = DraftTraits(k_max=k, branches=branches, grows_trees=branches > 1)
        self.min_confidence, self.branches, self.depth = min_confidence, branches, depth
        if path is None:
            path = cached_lm(target, order, require_corpus(corpus))
        self.lm = KneserNeyLM.load(path)
        check_fingerprint(self.lm.fingerprint, target, path)

    def reset(self, ctx: Context) -> None:
        pass  # the LM is fixed; each round reads the committed context

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        device, n = ctx.tokens.device, self.lm.order - 1
        host = ctx.on_host()  # the LM runs on the host: its contexts come from the host's copy
        contexts = [host.tokens[b, max(host.start[b], host.lengths[b] - n) : host.lengths[b]].tolist()
                    for b in range(len(host.start))]
        if self.branches > 1:
            return self._propose_tree(contexts, k, sampling, generator, device)
        drafted, probs = [], []
        confident = ~host.done  # [B]: rows still drafting, on the host (the LM's distributions are host arrays)
        n_proposed = np.zeros(len(contexts), dtype=np.int64)
        for _ in range(k):
            q_host = np.stack([self.lm.distribution(c) for c in contexts])  # [B, V]
            confident = confident & (q_host.max(-1) >= self.min_confidence)
            if not confident.any():
                break
            stopped = torch.from_numpy(~confident).to(device)
            # zero: not proposed
            q = warp_distribution(torch.from_numpy(q_host).float().to(device), sampling) * ~stopped[:, None]
            x = sample(q.clamp_min(0) + stopped[:, None], generator)  # [B]; any token for stopped rows
            drafted.append(x)
            probs.append(q)
            n_proposed += confident
            # the one readback per drafted token: the next context is on the host
            contexts = [(c + [t])[-n:] if n else [] for c, t in zip(contexts, x.tolist(), strict=True)]
        if not drafted:
            return Proposal.empty(len(contexts), self.lm.vocab_size, device)
        return Proposal(tokens=torch.stack(drafted, 1), probs=torch.stack(probs, 1),
                        n_proposed=torch.from_numpy(n_proposed).to(device), n_proposed_host=n_proposed)

    def _distributions(self, contexts: list[list[int]], sampling: SamplingConfig,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Contexts -> P_KN [n, V] and its warp q [n, V]."""
        raw = torch.from_numpy(np.stack([self.lm.distribution(c) for c in contexts])).float().to(device)
        return raw, warp_distribution(raw, sampling)

    def _propose_tree(self, contexts: list[list[int]], k: int, sampling: SamplingConfig,
                      generator: torch.Generator | None, device: torch.device) -> Proposal:
        n = self.lm.order - 1
        node_contexts = [{-1: c} for c in contexts]  # per row: node -> its last n tokens

        def expand(nodes, tokens, parents, depth):  # [B, e] each
            for row, node_row, token_row, parent_row in zip(node_contexts, nodes.tolist(), tokens.tolist(),
                                                            parents.tolist(), strict=True):
                for node, token, parent in zip(node_row, token_row, parent_row, strict=True):
                    row[node] = (row[parent] + [token])[-n:] if n else []
            flat = [row[node] for row, node_row in zip(node_contexts, nodes.tolist(), strict=True) for node in node_row]
            raw, q = self._distributions(flat, sampling, device)
            return raw.view(*nodes.shape, -1), q.view(*nodes.shape, -1)

        root_raw, root_q = self._distributions(contexts, sampling, device)
        tree = grow_tree(root_raw, root_q, expand, self.branches, k, self.depth, sampling, generator)
        n_proposed = torch.full((len(contexts),), tree.tokens.shape[1], dtype=torch.long, device=device)
        return Proposal(tokens=tree.tokens, probs=tree.probs, n_proposed=n_proposed, parents=tree.parents)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass
