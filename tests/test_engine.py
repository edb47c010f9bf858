"""The round engine: greedy exactness, sampled distributions, EOS/limit boundaries, seeds."""

import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.drafts.base import Drafter
from specexp.drafts.early_exit import SharedEarlyExitDrafter, early_exit_drafter
from specexp.drafts.ngram_lm import NgramLMDrafter
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.retrieval import RetrievalDrafter
from specexp.drafts.small_lm import SmallLMDrafter, top_probability
from tests.conftest import build_ngram_files, random_exit_head, reduced_vocab_copy, tiny_model
from tests.drafters import RandomDrafter
from tests.stats import P_VALUE_THRESHOLD, chi_square_p_value

GREEDY = SamplingConfig()
NO_EOS = [10**6]  # an id no model emits: runs go to max_new_tokens


def _gen(target, prompts, drafter, sampling=GREEDY, max_new=24, eos=NO_EOS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return generate(target.model, prompts, drafter, sampling, max_new, eos, g)


def confidence_quantile(draft, quantile: float = 0.5) -> float:
    """A quantile of the draft's top probability on random contexts: a min_confidence at which its
    rows stop drafting at some steps and not at others."""
    x = torch.randint(1, draft.vocab_size, (4, 30), generator=torch.Generator().manual_seed(0))
    vocab = draft.draft_vocab
    with torch.no_grad():
        logits = draft.model(x if vocab is None else vocab.to_draft(x)).logits
    confidence = top_probability(logits if vocab is None else logits[..., : vocab.size])
    return float(confidence.quantile(quantile))


def _drafters(kind: str, target, other, k: int, files: dict[str, str] | None = None) -> Drafter:
    return {
        "agree": lambda: SmallLMDrafter(target, target, k=k),
        "disagree": lambda: SmallLMDrafter(target, other, k=k),
        "random": lambda: RandomDrafter(target.vocab_size, k),
        "prompt_lookup": lambda: PromptLookupDrafter(target, k=k, max_n=3, min_n=1),
        "prompt_lookup_frequent": lambda: PromptLookupDrafter(target, k=k, max_n=2, min_n=1, choice="frequent",
                                                              max_tokens_after_match=[]),  # uncapped
        "ngram_lm": lambda: NgramLMDrafter(target, files["lm"], k=k),
        "retrieval": lambda: RetrievalDrafter(target, files["store"], k=k, combine_context=False),
        "retrieval+context": lambda: RetrievalDrafter(target, files["store"], k=k, max_match=4, context_max_n=3),
        "ngram_lm_confident": lambda: NgramLMDrafter(target, files["lm"], k=k, min_confidence=0.3),
        "retrieval_confident": lambda: RetrievalDrafter(target, files["store"], k=k, min_confidence=0.5),
        "reduced_vocab": lambda: SmallLMDrafter(target, reduced_vocab_copy(other), k=k),
        "small_lm_confident": lambda: SmallLMDrafter(target, other, k=k, min_confidence=confidence_quantile(other)),
        "small_lm_int8": lambda: SmallLMDrafter(target, other, k=k, quantize="int8"),
        "reduced_vocab_confident": lambda: confident_reduced_vocab_drafter(target, other, k),
        "early_exit_shared": lambda: early_exit_drafter(target, exit_layer=1, k=k, mode="shared"),
        "early_exit_naive": lambda: early_exit_drafter(target, exit_layer=1, k=k, mode="naive"),
        "early_exit_trained": lambda: SharedEarlyExitDrafter(target, random_exit_head(target, 1), k=k),
    }[kind]()


def confident_reduced_vocab_drafter(target, other, k: int) -> SmallLMDrafter:
    draft = reduced_vocab_copy(other)
    return SmallLMDrafter(target, draft, k=k, min_confidence=confidence_quantile(draft))


ALL_KINDS = ["agree", "disagree", "random", "prompt_lookup", "prompt_lookup_frequent", "ngram_lm", "retrieval",
             "retrieval+context", "ngram_lm_confident", "retrieval_confident", "reduced_vocab", "small_lm_confident",
             "small_lm_int8", "reduced_vocab_confident", "early_exit_shared", "early_exit_naive", "early_exit_trained"]


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_is_token_identical_to_target_alone(target, other_draft, prompts, ngram_files, kind, k, batch):
    batch_prompts = prompts[:batch] if batch == 1 else prompts
    alone = _gen(target, batch_prompts, None)
    spec = _gen(target, batch_prompts, _drafters(kind, target, other_draft, k, ngram_files))
    assert spec.tokens == alone.tokens
    assert all(len(t) == 24 for t in spec.tokens)
    rounds = spec.active.sum(0)
    if kind == "agree":  # a perfect draft: the prompt pass gives 1 token, then every round K+1
        assert rounds.tolist() == [-(-23 // (k + 1))] * len(batch_prompts)
        assert bool((spec.n_accepted[spec.active] == k).all())


def test_agreeing_draft_accepts_everything_and_others_do_not(target, other_draft, prompts):
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
    spec = _gen(target, prompts, _drafters(kind, target, other_draft, k, ngram_files), max_new=24, eos=[eos])
    for b, row in enumerate(alone.tokens):
        expected = row[: row.index(eos) + 1] if eos in row else row
        assert spec.tokens[b] == expected
    assert spec.tokens[0][-1] == eos and len(spec.tokens[0]) <= 6


@pytest.mark.parametrize("max_new", [1, 2, 5, 7])
def test_max_new_tokens_is_exact(target, prompts, max_new):
    spec = _gen(target, prompts, SmallLMDrafter(target, target, k=4), max_new=max_new)
    assert [len(t) for t in spec.tokens] == [max_new] * len(prompts)
    assert spec.tokens == _gen(target, prompts, None, max_new=max_new).tokens


SAMPLINGS = {"t1": SamplingConfig(temperature=1.0), "t0.8_topk12_topp0.95": SamplingConfig(0.8, 12, 0.95)}


def _exact_two_token_distribution(target, prompt: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """P(t1, t2 | prompt) under the warped target, flattened [V*V]."""
    V = target.vocab_size
    with torch.no_grad():
        p1 = logits_to_probs(target.model(torch.tensor([prompt])).logits[0, -1], sampling)  # [V]
        seconds = torch.tensor([prompt + [t] for t in range(V)])
        p2 = logits_to_probs(target.model(seconds).logits[:, -1], sampling)  # [V, V]
    return (p1[:, None] * p2).flatten()


@pytest.fixture(scope="module")
def small_vocab_target(tmp_path_factory):
    """A 12-token target (small enough to tabulate two-token distributions) and n-gram files for it."""
    target = tiny_model(10, layers=2, vocab_size=12, scale=4.0)
    return target, build_ngram_files(target, tmp_path_factory.mktemp("ngram12"))


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("kind", ["none", "disagree", "prompt_lookup", "ngram_lm", "ngram_lm_confident", "retrieval",
                                  "retrieval+context", "reduced_vocab", "small_lm_confident", "reduced_vocab_confident",
                                  "small_lm_int8", "early_exit_shared", "early_exit_naive", "early_exit_trained"])
def test_sampled_first_two_tokens_follow_the_target(small_vocab_target, kind, sampling):
    """Thousands of rows of one prompt in one batch: the engine's first two tokens ~ the target's."""
    target, files = small_vocab_target
    other = tiny_model(11, layers=1, vocab_size=12, scale=4.0)
    prompt = [3, 4, 5, 3, 4]
    drafter = None if kind == "none" else _drafters(kind, target, other, 3, files)
    rows = 12_000
    out = _gen(target, [prompt] * rows, drafter, sampling=sampling, max_new=2, seed=5)
    pairs = torch.tensor([t[0] * 12 + t[1] for t in out.tokens])
    expected = _exact_two_token_distribution(target, prompt, sampling)
    assert chi_square_p_value(torch.bincount(pairs, minlength=144), expected) > P_VALUE_THRESHOLD
    if drafter is not None:
        assert int(out.n_accepted.sum()) > 0  # the draft path was exercised


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
