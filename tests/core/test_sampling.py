"""The shared warp and the sampler."""

import pytest
import torch

from specexp.core.sampling import SamplingConfig, logits_to_probs, sample
from specexp.errors import UserInputError
from tests.stats import P_VALUE_THRESHOLD, chi_square_p_value


def test_greedy_is_one_hot_argmax():
    logits = torch.randn(4, 3, 50)
    probs = logits_to_probs(logits, SamplingConfig())
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4, 3))
    assert torch.equal((probs > 0).sum(-1), torch.ones(4, 3, dtype=torch.long))


def test_temperature_matches_softmax():
    logits = torch.randn(2, 30)
    torch.testing.assert_close(logits_to_probs(logits, SamplingConfig(temperature=0.5)), (logits / 0.5).softmax(-1))


def test_top_k_keeps_k_tokens_renormalised():
    logits = torch.randn(5, 40)
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=6))
    assert torch.equal((probs > 0).sum(-1), torch.full((5,), 6))
    top = logits.topk(6).indices
    torch.testing.assert_close(probs.gather(-1, top), logits.gather(-1, top).softmax(-1))


def test_top_p_keeps_smallest_set_reaching_p():
    probs_in = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    out = logits_to_probs(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.25, 0.0, 0.0]]) / 0.75)
    out = logits_to_probs(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.75))
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.25, 0.0, 0.0]]) / 0.75)
    out = logits_to_probs(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.76))
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.25, 0.15, 0.0]]) / 0.9)
    # The top token always survives.
    out = logits_to_probs(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.1))
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_sample_follows_unnormalised_probs_and_never_zero_ones():
    g = torch.Generator().manual_seed(0)
    weights = torch.tensor([0.0, 2.0, 0.0, 1.0, 5.0, 0.0])
    draws = sample(weights.expand(100_000, 6), g)
    assert chi_square_p_value(torch.bincount(draws, minlength=6), weights) > P_VALUE_THRESHOLD


def test_sample_one_hot_is_deterministic():
    one_hot = torch.nn.functional.one_hot(torch.tensor([3, 0, 9]), 10).float()
    for seed in range(20):
        assert sample(one_hot, torch.Generator().manual_seed(seed)).tolist() == [3, 0, 9]


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_sampling_values_are_rejected(kwargs):
    with pytest.raises(UserInputError):
        SamplingConfig(**kwargs)
