"""The round engine: greedy exactness, sampled distributions, EOS/limit boundaries, seeds."""

import numpy as np
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.early_exit import early_exit_drafter
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.k_policy.heuristic import HeuristicK
from tests.conftest import tiny_model
from tests.drafters import DRAFT_KINDS, ScriptedK, confidence_quantile, make_drafter

GREEDY = SamplingConfig()
NO_EOS = [10**6]  # an id no model emits: runs go to max_new_tokens


def _gen(target, prompts, drafter, sampling=GREEDY, max_new=24, eos=NO_EOS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return generate(target.model, prompts, drafter, sampling, max_new, eos, g)


ALL_KINDS = list(DRAFT_KINDS)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_is_token_identical_to_target_alone(target, other_draft, prompts, ngram_files, kind, k, batch):
    batch_prompts = prompts[:batch] if batch == 1 else prompts
    alone = _gen(target, batch_prompts, None)
    spec = _gen(target, batch_prompts, make_drafter(kind, target, other_draft, k, ngram_files))
    assert spec.tokens == alone.tokens
    assert all(len(t) == 24 for t in spec.tokens)
    # The draft path was exercised: tokens were proposed and some accepted (a draft that
    # never proposes would pass the identity above trivially).
    assert int(spec.n_proposed.sum()) > 0
    if kind != "random":  # a uniformly random draft matches the argmax by chance only
        assert int(spec.n_accepted.sum()) > 0, f"{kind} had no token accepted"
    rounds = spec.active.sum(0)
    if kind == "agree":  # a perfect draft: the prompt pass gives 1 token, then every round K+1
        assert rounds.tolist() == [-(-23 // (k + 1))] * len(batch_prompts)
        assert bool((spec.n_accepted[spec.active] == k).all())


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_any_k_each_round_is_token_identical_to_target_alone(target, other_draft, prompts, ngram_files, kind):
    """draft.k=auto's mechanics: every draft stays exact when K changes every round, when a round
    skips the draft (it catches up next time) and when its proposal is cut short."""
    alone = _gen(target, prompts, None)
    g = torch.Generator().manual_seed(0)
    spec = generate(target.model, prompts, make_drafter(kind, target, other_draft, 4, ngram_files), GREEDY, 24, NO_EOS,
                    g, k_policy=ScriptedK(seed=len(kind)))
    assert spec.tokens == alone.tokens
    assert 0 in spec.k_chosen and max(spec.k_chosen) == 4 and int(spec.n_proposed.sum()) > 0


class LateK:
    """No draft for the first ``wait`` rounds, then k_max: a draft first asked mid-batch."""

    def __init__(self, wait: int):
        self.wait = wait

    def begin(self, batch_size, k_max, max_new_tokens):
        self.k_max, self.rounds = k_max, 0

    def choose(self, ctx):
        self.rounds += 1
        return 0 if self.rounds <= self.wait else self.k_max

    def shorten(self, proposal, ctx):
        return proposal

    def observe(self, seen):
        pass


@pytest.mark.parametrize("kind", ["agree", "disagree", "prompt_lookup", "early_exit_shared"])
def test_a_draft_first_asked_after_a_row_finished_stays_exact(target, other_draft, prompts, ngram_files, kind):
    """A draft's cache is filled at its first proposal, when rows may hold different numbers of
    tokens (here one row ended at an EOS during the rounds without a draft)."""
    eos = [_gen(target, prompts, None).tokens[0][2]]  # row 0 ends at its third token
    alone = _gen(target, prompts, None, eos=eos)
    assert min(map(len, alone.tokens)) <= 3 < max(map(len, alone.tokens))
    g = torch.Generator().manual_seed(0)
    spec = generate(target.model, prompts, make_drafter(kind, target, other_draft, 4, ngram_files), GREEDY, 24, eos,
                    g, k_policy=LateK(wait=4))
    assert spec.tokens == alone.tokens
    assert spec.k_chosen[:4] == [0] * 4 and int(spec.n_proposed.sum()) > 0


def test_heuristic_k_grows_after_full_acceptance_and_shrinks_after_a_miss(target, other_draft, prompts):
    policy = HeuristicK(start=2)
    agree = _gen(target, prompts[:1], None)
    spec = generate(target.model, prompts[:1], make_drafter("agree", target, other_draft, 8, {}), GREEDY, 24, NO_EOS,
                    torch.Generator().manual_seed(0), k_policy=policy)
    assert spec.tokens == agree.tokens
    assert spec.k_chosen[:4] == [2, 4, 6, 8]  # a perfect draft: +2 a round up to k_max
    disagree = generate(target.model, prompts[:1], SmallLMDrafter(target, other_draft, k=8), GREEDY, 24, NO_EOS,
                        torch.Generator().manual_seed(0), k_policy=HeuristicK())
    steps = np.diff(disagree.k_chosen)
    assert set(steps.tolist()) <= {-1, 0, 2} and -1 in steps.tolist()


def test_agreeing_draft_accepts_everything_and_others_do_not(target, other_draft, prompts):
    """Greedy: the target drafting for itself has every proposed token accepted; another model some, not all."""
    agree = _gen(target, prompts, SmallLMDrafter(target, target, k=4))
    proposed = agree.n_proposed[agree.active]
    assert int(proposed.sum()) > 0 and bool((agree.n_accepted[agree.active] == proposed).all())
    disagree = _gen(target, prompts, SmallLMDrafter(target, other_draft, k=4))
    accepted = disagree.n_accepted[disagree.active]
    assert 0 < int(accepted.sum()) < int(disagree.n_proposed[disagree.active].sum())


def test_rows_with_different_acceptance_stay_exact_per_row(target, other_draft, prompts):
    """Each row of a batch decodes exactly as that prompt would alone (ragged tips)."""
    spec = _gen(target, prompts, SmallLMDrafter(target, other_draft, k=3), max_new=30)
    for b, prompt in enumerate(prompts):
        assert spec.tokens[b] == _gen(target, [prompt], None, max_new=30).tokens[0]
    # The rows really did accept different counts in some round.
    assert any(len(set(row[spec.active[r]].tolist())) > 1 for r, row in enumerate(spec.n_accepted))


@pytest.mark.parametrize("kind", ["agree", "disagree", "prompt_lookup", "ngram_lm", "retrieval+context"])
@pytest.mark.parametrize("k", [1, 4])
def test_eos_stops_and_nothing_after_it_is_committed(target, other_draft, prompts, ngram_files, kind, k):
    alone = _gen(target, prompts, None, max_new=24)
    eos = alone.tokens[0][5]  # a token the target emits at position 5 of row 0
    spec = _gen(target, prompts, make_drafter(kind, target, other_draft, k, ngram_files), max_new=24, eos=[eos])
    for b, row in enumerate(alone.tokens):
        expected = row[: row.index(eos) + 1] if eos in row else row
        assert spec.tokens[b] == expected
    assert spec.tokens[0][-1] == eos and len(spec.tokens[0]) <= 6


@pytest.mark.parametrize("max_new", [1, 2, 5, 7])
def test_max_new_tokens_is_exact(target, prompts, max_new):
    spec = _gen(target, prompts, SmallLMDrafter(target, target, k=4), max_new=max_new)
    assert [len(t) for t in spec.tokens] == [max_new] * len(prompts)
    assert spec.tokens == _gen(target, prompts, None, max_new=max_new).tokens


def test_a_confident_small_lm_stops_rows_independently(target, other_draft, prompts):
    """Rows stop drafting at different steps, some rounds propose nothing, some all K; the
    draft's cache rewinds right through all of it (the tokens equal the target's alone)."""
    drafter = SmallLMDrafter(target, other_draft, k=4, min_confidence=confidence_quantile(other_draft, 0.25))
    spec = _gen(target, prompts, drafter, max_new=30)
    assert spec.tokens == _gen(target, prompts, None, max_new=30).tokens
    proposed = spec.n_proposed[spec.active]
    assert {0, 4} <= set(proposed.tolist()) and bool(((proposed > 0) & (proposed < 4)).any())
    assert bool((spec.n_accepted[spec.active] <= proposed).all())
    never = SmallLMDrafter(target, other_draft, k=4, min_confidence=0.999)  # nothing is that sure: plain AR rounds
    assert int(_gen(target, prompts, never).n_proposed.sum()) == 0


def test_seeded_runs_repeat_exactly(target, other_draft, prompts):
    sampling = SamplingConfig(temperature=1.0)
    a = _gen(target, prompts, SmallLMDrafter(target, other_draft, k=3), sampling=sampling, seed=3)
    b = _gen(target, prompts, SmallLMDrafter(target, other_draft, k=3), sampling=sampling, seed=3)
    c = _gen(target, prompts, SmallLMDrafter(target, other_draft, k=3), sampling=sampling, seed=4)
    assert a.tokens == b.tokens and torch.equal(a.n_accepted, b.n_accepted)
    assert a.tokens != c.tokens


def test_bad_engine_arguments(target):
    with pytest.raises(ValueError, match="max_new_tokens"):
        _gen(target, [[1, 2]], None, max_new=0)
    with pytest.raises(ValueError, match="at least one token"):
        _gen(target, [[]], None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_greedy_matches_target_alone(prompts):
    """The same engine on CUDA (fp32): greedy speculative output equals the target alone."""
    from specexp.models import LoadedModel

    target_cpu = tiny_model(0, layers=2)
    target = LoadedModel(target_cpu.model.to("cuda", torch.float32), None, "tiny-cuda")
    draft = LoadedModel(tiny_model(1, layers=1).model.to("cuda", torch.float32), None, "tiny-cuda-draft")
    g = torch.Generator(device="cuda").manual_seed(0)
    alone = generate(target.model, prompts, None, GREEDY, 16, NO_EOS, g)
    for drafter in (SmallLMDrafter(target, draft, k=3), PromptLookupDrafter(target, k=3),
                    early_exit_drafter(target, exit_layer=1, k=3, mode="shared"),
                    early_exit_drafter(target, exit_layer=1, k=3, mode="naive")):
        assert generate(target.model, prompts, drafter, GREEDY, 16, NO_EOS, g).tokens == alone.tokens
