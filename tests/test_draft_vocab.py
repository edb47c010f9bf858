"""Reduced draft vocabularies: the id maps, q = 0 outside the kept tokens, save/load, refusals."""

import pytest
import torch

from specexp.core.interface import Context
from specexp.core.sampling import SamplingConfig, logits_to_probs, sample
from specexp.draft_vocab import DraftVocab, frequent_tokens
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError
from specexp.models import load_model
from tests.conftest import EOS, reduced_vocab_copy


def test_frequent_tokens_ranks_by_count_and_keeps_required_ids():
    docs = [[5, 5, 5, 7, 7, 9], [7, 3]]
    assert frequent_tokens(docs, 3, always=[1]) == [1, 5, 7]
    assert frequent_tokens(docs, 10, always=[1]) == [1, 3, 5, 7, 9]  # fewer distinct tokens than asked
    with pytest.raises(UserInputError, match="draft vocabulary size 1 is too small"):
        frequent_tokens(docs, 1, always=[1, 2])


def test_maps_between_target_and_draft_ids():
    vocab = DraftVocab([2, 5, 9], target_vocab_size=12)
    assert vocab.to_draft(torch.tensor([5, 2, 9, 0, 11])).tolist() == [1, 0, 2, 3, 3]  # 3 = "other"
    assert vocab.to_target(torch.tensor([2, 0, 1])).tolist() == [9, 2, 5]
    logits = torch.tensor([[1.0, 2.0, 3.0, 10.0]])  # [1, N+1]; the "other" logit is dropped
    full = vocab.to_target_logits(logits)
    assert full.shape == (1, 12)
    assert full[0, [2, 5, 9]].tolist() == [1.0, 2.0, 3.0]
    assert torch.isinf(full[0, [0, 1, 3, 4, 6, 7, 8, 10, 11]]).all()
    log_p = torch.log_softmax(torch.randn(4, 12), -1)
    coarse = vocab.coarsen_log_probs(log_p)  # [4, N+1]
    torch.testing.assert_close(coarse.exp().sum(-1), torch.ones(4))
    torch.testing.assert_close(coarse[:, :3], log_p[:, [2, 5, 9]])
    with pytest.raises(UserInputError, match="distinct target ids"):
        DraftVocab([2, 2], target_vocab_size=12)


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=1.0),
                                 SamplingConfig(temperature=0.7, top_k=3),
                                 SamplingConfig(temperature=1.3, top_p=0.8)], ids=["greedy", "t1", "top_k", "top_p"])
def test_sampling_over_the_kept_tokens_equals_sampling_the_target_space(cfg):
    """The draft-space shortcut draws the same tokens with the same q as warping V logits that
    are -inf outside the kept ids (same generator state, ascending kept ids)."""
    vocab = DraftVocab([0, 2, 5, 6, 9, 11], target_vocab_size=12)
    logits = torch.randn(200, vocab.size + 1, generator=torch.Generator().manual_seed(1))  # [B, N+1]
    full_q = logits_to_probs(vocab.to_target_logits(logits), cfg)  # [B, V]
    full_x = sample(full_q, torch.Generator().manual_seed(7))
    x, q = vocab.sample(logits, cfg, torch.Generator().manual_seed(7))
    torch.testing.assert_close(q, full_q)
    assert torch.equal(x, full_x)
    assert torch.isin(x, vocab.target_ids).all()


def test_a_reduced_draft_proposes_only_its_tokens_with_zero_q_elsewhere(target, other_draft, prompts):
    draft = reduced_vocab_copy(other_draft, keep_every=3)
    kept = draft.draft_vocab.target_ids
    drafter = SmallLMDrafter(target, draft, k=4)
    lengths = torch.tensor([len(p) for p in prompts])
    P = int(lengths.max())
    tokens = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    ctx = Context(tokens=tokens, start=P - lengths, lengths=torch.full((3,), P), done=torch.zeros(3, dtype=torch.bool))
    drafter.reset(ctx)
    proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(temperature=1.0),
                               torch.Generator().manual_seed(0))
    assert torch.isin(proposal.tokens, kept).all()
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[kept] = False
    assert (proposal.probs[..., outside] == 0).all()
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3, 4, dtype=proposal.probs.dtype))


def test_saved_vocabulary_loads_with_the_model_and_is_checked(target, other_draft, tmp_path):
    draft = reduced_vocab_copy(other_draft)
    draft.model.save_pretrained(tmp_path / "d")
    draft.draft_vocab.fingerprint = "vocab_size=64"  # what vocab_fingerprint gives a tokenizer-less target
    draft.draft_vocab.save(tmp_path / "d")
    loaded = load_model(str(tmp_path / "d"), dtype="float64", device="cpu")
    assert loaded.draft_vocab.target_ids.tolist() == draft.draft_vocab.target_ids.tolist()
    assert loaded.vocab_size == target.vocab_size  # the token-id space is the target's
    SmallLMDrafter(target, loaded, k=2)
    loaded.draft_vocab.fingerprint = "vocab_size=64:sha256=0123"
    with pytest.raises(UserInputError, match="vocab mismatch: the reduced vocabulary of draft"):
        SmallLMDrafter(target, loaded, k=2)
    assert EOS in loaded.draft_vocab.target_ids.tolist()
