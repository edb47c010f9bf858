"""Acceptance predicted before decoding (specexp/study/replay.py): under greedy the replay is the
study's own rounds (the same acceptance, to the token); under sampling its estimate, exact in
expectation at every depth, agrees with what the engine measures at K = 1, 2 and 3; each round is
priced at its own proposal length with the cost model's formula."""

import numpy as np
import pytest
import torch

from specexp.core import metrics
from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.costs.cost_model import predict_from_curve, price_rounds, round_yields
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.study.replay import acceptance_curve, alpha, draft_along, replay, teacher_forced
from tests.conftest import noisy_copy, tiny_model
from tests.drafters import make_drafter


@pytest.fixture(scope="module")
def sharp_target():
    return tiny_model(0, layers=2, scale=4.0)  # peaked distributions: acceptance far from 1

NO_EOS = [10**6]
CPU = torch.device("cpu")
# chains that run their own passes (the replay's domain): a model, a lookup, a context-dependent
# datastore, a draft that stops short, an early exit run naively, and heads reading target features (EAGLE-1,
# EAGLE-3 as published, Medusa)
REPLAYED_KINDS = ["disagree", "prompt_lookup", "retrieval+context", "small_lm_confident", "early_exit_naive", "eagle",
                  "eagle3_published", "medusa"]


@pytest.mark.parametrize(("kind", "k"), [*((kind, 3) for kind in REPLAYED_KINDS), ("disagree", 1),
                                         ("prompt_lookup", 1)])
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
    assert len(rounds.run) == len(depth) and accepted.sum() > 0 and sorted(rounds.proposed) == sorted(depth.tolist())
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
    references = [generate(target.model, [prompt], None, sampling, 17, NO_EOS,
                           torch.Generator().manual_seed(i)).tokens[0]
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
    spread = np.sqrt(np.var([run[0] for run in rounds.run]) / len(rounds.run)
                     + accepted.var() / len(accepted))
    assert 0.1 < measured < 0.95  # a draft that is neither always right nor always wrong
    assert abs(predicted - measured) < 5 * spread, (predicted, measured, spread)


def sampled_replay(target, drafter_of, prompts, k, sampling, references_per_prompt, along: bool):
    """The replay along ``references_per_prompt`` sampled continuations of each prompt (16 tokens each)."""
    pairs = [(prompt, generate(target.model, [prompt], None, sampling, 16 + k, NO_EOS,
                               torch.Generator().manual_seed(100 * r + i)).tokens[0])
             for i, prompt in enumerate(prompts) for r in range(references_per_prompt)]
    rows, references = [p for p, _ in pairs], [ref for _, ref in pairs]
    probs = [teacher_forced(target.model, p, ref, sampling, ())[0] for p, ref in pairs]
    features = [None] * len(rows)
    q_along = drafter_of().q_along(rows, references, sampling) if along else None  # as the pairing runs it
    return replay(drafter_of(), rows, references, probs, features, k, sampling, torch.Generator().manual_seed(0), CPU,
                  new_tokens=16, q_along=q_along)


@pytest.mark.parametrize("min_confidence", [0.0, 0.2])
def test_a_small_lms_teacher_forced_q_is_its_one_token_proposals_along_the_reference(sharp_target, min_confidence):
    """q_along (one pass over prompt + R) gives what proposing one token at every prefix of R gives
    (draft_along, through the draft's contract), a doubtful token's row included (0: not proposed)."""
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    other = noisy_copy(sharp_target, noise=0.6, seed=5)
    prompts = [[3 + i, 7, 11 + i][: 2 + i % 2] for i in range(4)]
    references = [generate(sharp_target.model, [p], None, sampling, 12 + i, NO_EOS,
                           torch.Generator().manual_seed(i)).tokens[0]
                  for i, p in enumerate(prompts)]
    drafter = SmallLMDrafter(sharp_target, other, k=3, min_confidence=min_confidence)
    stepped = draft_along(drafter, prompts, references, [None] * 4, sampling, torch.Generator().manual_seed(0), CPU)
    forced = drafter.q_along(prompts, references, sampling)
    for s_b, f_b, ref in zip(stepped, forced, references, strict=True):
        assert f_b.shape == (len(ref), sharp_target.vocab_size) and torch.allclose(f_b, s_b, atol=1e-5)
    if min_confidence:
        assert any((f_b.sum(-1)[1:] == 0).any() for f_b in forced)  # some prefixes are doubtful: the case is tested


def test_a_draft_that_is_its_target_is_accepted_at_every_depth_of_the_sampled_replay(sharp_target):
    """q = p: the rule accepts every token, so every depth's acceptance is 1. Judging depth i >= 2 with
    the draft's q on its own sampled prefix and p on R's gave ~0.7 there (the bias this replaced)."""
    sampling = SamplingConfig(temperature=1.0)
    prompts = [[3 + i, 7, 11 + i] for i in range(6)]
    rounds = sampled_replay(sharp_target, lambda: SmallLMDrafter(sharp_target, sharp_target, k=3), prompts, 3, sampling,
                            1, along=True)
    assert acceptance_curve(rounds, 3) == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)  # p and q in float32
    own = sampled_replay(sharp_target, lambda: SmallLMDrafter(sharp_target, sharp_target, k=3), prompts, 3, sampling,
                         1, along=False)
    assert own.run and acceptance_curve(own, 3)[0] == pytest.approx(1.0) and acceptance_curve(own, 3)[1] < 0.95


def ratio_se(took: np.ndarray, reached: np.ndarray, unit: np.ndarray) -> float:
    """The standard error of sum(took) / sum(reached) over independent units (the rounds' prompts:
    rounds of one decode, or of one prompt, are not independent), by linearization."""
    took, reached = np.bincount(unit, took), np.bincount(unit, reached)  # [U] each
    ratio = took.sum() / reached.sum()
    return float(np.sqrt(((took - ratio * reached) ** 2).sum()) / reached.sum())


def measured_positions(out, k):
    """Per active (round, row) of an engine decode: accepted and reached at depths 1..k [N, k] each,
    and the row of each [N]."""
    depth, accepted = out.depth[out.active].numpy(), out.n_accepted[out.active].numpy()
    reached, took = metrics.position_counts(depth, accepted, None, k)
    return took.astype(float), reached.astype(float), torch.nonzero(out.active)[:, 1].numpy()


@pytest.mark.parametrize("kind", ["small_lm", "prompt_lookup"])
@pytest.mark.parametrize("k", [2, 3])
def test_the_sampled_replay_predicts_the_engines_acceptance_at_every_depth(sharp_target, kind, k):
    """T = 1, a small LM (a noisy copy of the target) and prompt lookup (uncapped: it proposes K after
    any match, nothing without one), K = 2 and 3: the replay's acceptance at each depth along 3 sampled
    continuations of each of 30 prompts against what the engine measures over 30 x 6 sampled decodes.
    Both estimate the same expectation at the rounds' starts, so they agree within 5 standard errors of
    their difference at every depth (a false failure: < 6e-7 each, normal approximation; the rounds of
    one prompt are dependent: the errors are over prompts)."""
    # lookup copies text: a target sharp enough to repeat itself at T = 1 makes its copies likely (p of a
    # copied token ~0.5), so depths 2 and 3 are reached hundreds of times; sharp_target's are ~0.05
    target = sharp_target if kind == "small_lm" else tiny_model(0, layers=2, scale=60.0)
    sampling = SamplingConfig(temperature=1.0)
    prompts = [generate(target.model, [[3 + i % 7, 5 + i]], None, sampling, 16, NO_EOS,
                        torch.Generator().manual_seed(1000 + i)).tokens[0] for i in range(30)]
    other = noisy_copy(target, noise=0.6, seed=5)

    def drafter_of():
        return (SmallLMDrafter(target, other, k=k) if kind == "small_lm"
                else PromptLookupDrafter(target, k=k, max_n=3, min_n=1, max_tokens_after_match=[]))

    rounds = sampled_replay(target, drafter_of, prompts, k, sampling, 3, along=kind == "small_lm")
    took_r, reached_r = np.zeros((len(rounds.run), k)), np.zeros((len(rounds.run), k))
    for r, run in enumerate(rounds.run):
        n = min(len(run), k)
        took_r[r, :n], reached_r[r, :n] = run[:n], np.concatenate([[1.0], run[: n - 1]])[:n]
    prompt_r = np.asarray(rounds.prompt) // 3  # sampled_replay's rows: 3 continuations of each prompt in turn
    out = generate(target.model, prompts * 6, drafter_of(), sampling, 16, NO_EOS, torch.Generator().manual_seed(2))
    took_m, reached_m, row_m = measured_positions(out, k)
    prompt_m = row_m % len(prompts)
    for i in range(k):
        predicted, measured = took_r[:, i].sum() / reached_r[:, i].sum(), took_m[:, i].sum() / reached_m[:, i].sum()
        se = np.hypot(ratio_se(took_r[:, i], reached_r[:, i], prompt_r),
                      ratio_se(took_m[:, i], reached_m[:, i], prompt_m))
        assert reached_m[:, i].sum() > 100, f"depth {i + 1} reached too rarely to test"
        assert abs(predicted - measured) < 5 * se, (i + 1, predicted, measured, se)


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

    from specexp.study import pairing_prediction as pairing
    from specexp.study import references

    study = SimpleNamespace(forward=target.model, target=SimpleNamespace(name=f"tiny-{id(target)}", model=target.model,
                                                                         eos_token_ids=NO_EOS, pad_token_id=0),
                            encoded=prompts[:2], sampling=SamplingConfig(temperature=1.0), seed=0, max_new_tokens=8,
                            batch_size=1)
    first = pairing.references(study, extra=2)
    assert [len(r) for r in first] == [10, 10]
    monkeypatch.setattr(references, "generate", lambda *a, **k: pytest.fail("generated a continuation again"))
    assert pairing.references(study, extra=2) == first


def test_rounds_are_priced_with_their_own_proposal_lengths():
    """Two rounds, one that proposed 3 tokens (accepted with 0.9, 0.8, 0.5 run) and one that proposed
    nothing (a lookup without a match): at K = 3 the first commits 1 + 0.9 + 0.8 + 0.5 and passes 4
    tokens, the second commits 1 and passes 1; at K = 1 the first is cut to one token. Pricing every
    round as proposing K (a curve) would over-predict."""
    runs, proposed = [np.array([0.9, 0.8, 0.5]), np.array([])], np.array([3, 0])
    tokens, target_s = round_yields(runs, proposed, 3, FlatProfile(), "d", 100.0)
    assert tokens == pytest.approx([3.2, 1.0]) and target_s == pytest.approx([1.3, 1.0])
    tokens_1, target_s_1 = round_yields(runs, proposed, 1, FlatProfile(), "d", 100.0)
    assert tokens_1 == pytest.approx([1.9, 1.0]) and target_s_1 == pytest.approx([1.1, 1.0])
    speedup = price_rounds(tokens.mean(), target_s.mean(), 3, FlatProfile(), "d", 100.0, 10.0, 1001)
    assert speedup == pytest.approx(tokens.mean() / (0.15 + target_s.mean()))
    as_curve = predict_from_curve([0.9, 0.8 / 0.9, 0.5 / 0.8], 3, FlatProfile(), "d", 100.0, 10.0, 1001)
    assert speedup == pytest.approx(2.1 / 1.3) and as_curve["predicted_speedup"] == pytest.approx(3.2 / 1.45)
    assert price_rounds(1.0, 1.0, 0, FlatProfile(), "d", 100.0, 10.0, 1001) == pytest.approx(1.0)  # K = 0: AR
