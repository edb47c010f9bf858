"""Hidden states for feature drafts: what `Context.features` holds at every round equals
transformers' output_hidden_states of the committed sequence, through ragged rewinds and token
trees, on both runtimes."""

import dataclasses

import pytest
import torch

from specexp.core.engine import generate
from specexp.core.interface import Context, DraftTraits, Proposal
from specexp.core.sampling import SamplingConfig
from specexp.runtime.decoder import lean_decoder
from tests.drafters import make_drafter

NO_EOS = [10**6]


class Recording:
    """Wraps a draft; reads the committed slots' features at every proposal, as a feature draft would."""

    def __init__(self, inner, hidden_layers: tuple[int, ...]):
        self.inner, self.seen = inner, []
        self.traits = dataclasses.replace(inner.traits, hidden_layers=hidden_layers)

    def reset(self, ctx: Context) -> None:
        self.inner.reset(ctx)

    def propose(self, ctx: Context, k: int, sampling, generator) -> Proposal:
        rows = [(int(s), int(n)) for s, n in zip(ctx.start, ctx.lengths, strict=True)]
        self.seen.append([(ctx.tokens[b, s:n].clone(), ctx.features[b, s : n - 1].clone())
                          for b, (s, n) in enumerate(rows)])
        return self.inner.propose(ctx, k, sampling, generator)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        self.inner.update(ctx, proposal, n_accepted)


def reference_features(model, tokens: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """transformers' hidden states at ``layers`` of one row's committed tokens but the tip [T-1, F]."""
    states = model(tokens[None, :-1], output_hidden_states=True).hidden_states
    return torch.cat([states[j][0] for j in layers], dim=-1)


@pytest.mark.parametrize("runtime", ["hf", "lean"])
@pytest.mark.parametrize("kind", ["random", "prompt_lookup_tree", "small_lm_tree"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0)], ids=["greedy", "sampled"])
def test_features_equal_transformers_hidden_states_through_ragged_rewinds(target, other_draft, prompts, ngram_files,
                                                                          runtime, kind, sampling):
    layers = (0, 1, 2)  # the embeddings, a layer's output, the final normed state
    drafter = Recording(make_drafter(kind, target, other_draft, 4, ngram_files), layers)
    forward = target.model if runtime == "hf" else lean_decoder(target.model)
    out = generate(forward, prompts, drafter, sampling, 20, NO_EOS, torch.Generator().manual_seed(0))
    assert int(out.n_accepted.sum()) > 0 and len(drafter.seen) > 3
    ragged = [(out.n_accepted[r] != out.n_accepted[r, 0]).any() for r in range(out.n_accepted.shape[0])]
    assert any(ragged), "rows never accepted different numbers: no ragged rewind was exercised"
    with torch.no_grad():
        for snapshot in drafter.seen:
            for tokens, features in snapshot:
                torch.testing.assert_close(features, reference_features(target.model, tokens, layers),
                                           rtol=1e-9, atol=1e-9)


def test_a_draft_that_reads_no_features_gets_none(target, other_draft, prompts, ngram_files):
    seen = []

    class Plain:
        traits = DraftTraits(k_max=2)

        def reset(self, ctx):
            pass

        def propose(self, ctx, k, sampling, generator):
            seen.append(ctx.features)
            return Proposal.empty(ctx.tokens.shape[0], target.vocab_size, ctx.tokens.device)

        def update(self, ctx, proposal, n_accepted):
            pass

    generate(target.model, prompts, Plain(), SamplingConfig(), 4, NO_EOS)
    assert seen and all(f is None for f in seen)
