"""Acceptance predicted before decoding (specexp/study/replay.py): under greedy the replay is the
study's own rounds (the same acceptance, to the token); under sampling its sum min(p, q) estimate of
the first position's acceptance agrees with what the engine measures; the pricing is the cost
model's formula."""

import numpy as np
import pytest
import torch

from specexp.core import metrics
from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.costs.cost_model import predict_from_curve
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.study.replay import acceptance_curve, alpha, replay, teacher_forced
from tests.conftest import noisy_copy, tiny_model
from tests.drafters import make_drafter


@pytest.fixture(scope="module")
def sharp_target():
    return tiny_model(0, layers=2, scale=4.0)  # peaked distributions: acceptance far from 1

NO_EOS = [10**6]
CPU = torch.device("cpu")
# chains that run their own passes (the replay's domain): a model, a lookup, a context-dependent
# datastore, a draft that stops short, an early exit run naively, and heads reading target features
REPLAYED_KINDS = ["disagree", "prompt_lookup", "retrieval+context", "small_lm_confident", "early_exit_naive", "eagle",
                  "medusa"]


@pytest.mark.parametrize(("kind", "k"), [*((kind, 3) for kind in REPLAYED_KINDS), ("disagree", 1), ("prompt_lookup", 1)])
def test_greedy_replay_is_the_studys_own_rounds(target, other_draft, ngram_files, prompts, kind, k):
    """The prompts (of three lengths) replayed in one ragged batch: the rounds each prompt's study has."""
    references, measured_depth, measured_accepted = [], [], []
    for prompt in prompts:
        references.append(generate(target.model, [prompt], None, SamplingConfig(), 24 + k, NO_EOS).tokens[0])
        drafter = make_drafter(kind, target, other_draft, k, ngram_files)
        out = generate(target.model, [prompt], drafter, SamplingConfig(), 24, NO_EOS)
        assert out.tokens[0] == references[-1][:24]
        measured_depth += out.depth[:, 0].tolist()
        measured_accepted += out.n_accepted[:, 0].tolist()
    layers = drafter.traits.hidden_layers
    features = [teacher_forced(target.model, prompt, reference, SamplingConfig(), layers)[1]
                for prompt, reference in zip(prompts, references, strict=True)]
    rounds = replay(make_drafter(kind, target, other_draft, k, ngram_files), prompts, references, [None] * 3, features,
                    k, SamplingConfig(), None, CPU, new_tokens=24)
    depth, accepted = np.array(measured_depth), np.array(measured_accepted)
    assert len(rounds.conditional) == len(depth) and accepted.sum() > 0
    assert alpha(rounds, k) == pytest.approx(metrics.alpha(depth, accepted), abs=1e-12)
    assert acceptance_curve(rounds, k) == pytest.approx(metrics.acceptance_curve(depth, accepted, k), abs=1e-12)


def test_sampled_first_position_acceptance_matches_the_engines(sharp_target):
    """T = 1: the replay's estimate along one sampled continuation of each of 40 prompts against the engine's
    accepted share of first positions over 40 x 3 sampled decodes; both estimate E[sum min(p, q)] at rounds'
    starts, so they agree within their sampling error (5 standard errors: false failure < 1e-6)."""
    target, other_draft = sharp_target, noisy_copy(sharp_target, noise=1.0, seed=3)
    sampling = SamplingConfig(temperature=1.0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, target.vocab_size, (6,), generator=g).tolist() for _ in range(40)]
    references = [generate(target.model, [prompt], None, sampling, 17, NO_EOS, torch.Generator().manual_seed(i)).tokens[0]
                  for i, prompt in enumerate(prompts)]
    probs = [teacher_forced(target.model, prompt, reference, sampling, ())[0]
             for prompt, reference in zip(prompts, references, strict=True)]
    rounds = replay(SmallLMDrafter(target, other_draft, k=1), prompts, references, probs, [None] * len(prompts), 1,
                    sampling, torch.Generator().manual_seed(0), CPU, new_tokens=16)
    predicted = alpha(rounds, 1)
    out = generate(target.model, prompts * 3, SmallLMDrafter(target, other_draft, k=1), sampling, 16, NO_EOS,
                   torch.Generator().manual_seed(1))
    accepted = out.n_accepted[out.active].numpy().astype(float)
    measured = accepted.mean()
    spread = np.sqrt(np.var([c[0] for c in rounds.conditional]) / len(rounds.conditional)
                     + accepted.var() / len(accepted))
    assert 0.1 < measured < 0.95  # a draft that is neither always right nor always wrong
    assert abs(predicted - measured) < 5 * spread, (predicted, measured, spread)


class FlatProfile:
    """T(n) = 1 + 0.1 (n - 1) seconds, draft 0.05 s a token, no bookkeeping or prompt pass."""

    overhead_s = 0.0

    def draft_s(self, draft, k):
        return 0.05 * np.asarray(k)

    def pass_s(self, n, context, draft=None):
        return 1.0 + 0.1 * (np.asarray(n) - 1)

    def prefill(self, length):
        return 0.0

    def reset_s(self, draft):
        return 0.0


def test_pricing_a_curve_is_tokens_per_round_over_round_seconds():
    priced = predict_from_curve([0.8, 0.5, None], 3, FlatProfile(), "d", 100.0, 10.0, 1001)
    tokens = 1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.5  # the missing position takes the last measured
    assert priced["predicted_tau"] == pytest.approx(tokens)
    assert priced["predicted_speedup"] == pytest.approx(tokens / (0.15 + 1.3))
    declined = predict_from_curve([0.8], 0, FlatProfile(), "d", 100.0, 10.0, 1001)  # K = 0: AR exactly
    assert declined == {"predicted_tau": 1.0, "predicted_speedup": pytest.approx(1.0)}


class SharedPassProfile(FlatProfile):
    """An early-exit draft's own pass (its profile entry's pass_s): a third dearer than the target's."""

    def pass_s(self, n, context, draft=None):
        return super().pass_s(n, context) * (4 / 3 if draft else 1.0)


def test_a_draft_that_shares_the_target_pass_is_priced_with_its_pass_when_drafting_and_as_ar_at_k_0():
    priced = predict_from_curve([0.5], 1, SharedPassProfile(), "d", 100.0, 10.0, 1001)
    assert priced["predicted_speedup"] == pytest.approx(1.5 / (0.05 + 1.1 * 4 / 3))
    declined = predict_from_curve([0.5], 0, SharedPassProfile(), "d", 100.0, 10.0, 1001)  # no shared pass runs
    assert declined["predicted_speedup"] == pytest.approx(1.0)


def test_sampled_references_are_written_once_per_target_and_shared_by_its_drafts(target, prompts, monkeypatch):
    """python -m specexp.pairing replays every draft of a target along the same sampled continuations:
    the second draft's call generates nothing and gets the first's, token for token."""
    from types import SimpleNamespace

    from specexp.reporting import pairing

    study = SimpleNamespace(forward=target.model, target=SimpleNamespace(name=f"tiny-{id(target)}", model=target.model,
                                                                         eos_token_ids=NO_EOS, pad_token_id=0),
                            encoded=prompts[:2], sampling=SamplingConfig(temperature=1.0), seed=0, max_new_tokens=8,
                            batch_size=1)
    first = pairing.references(study, extra=2)
    assert [len(r) for r in first] == [10, 10]
    monkeypatch.setattr(pairing, "generate", lambda *a, **k: pytest.fail("generated a continuation again"))
    assert pairing.references(study, extra=2) == first
