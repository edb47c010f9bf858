"""Distillation objectives against direct computations."""

import math

import pytest
import torch

from specexp.distill.objectives import forward_kl, jensen_shannon, objective, reverse_kl, total_variation
from specexp.errors import UserInputError


def test_identical_distributions_have_zero_divergence():
    logits = torch.randn(5, 11)
    for fn in (forward_kl, reverse_kl, total_variation, jensen_shannon):
        torch.testing.assert_close(fn(logits, logits), torch.zeros(5), atol=1e-6, rtol=0)


def test_known_values():
    p, q = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.9, 0.1]])
    kl_pq = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    kl_qp = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    m = (p + q) / 2
    jsd = 0.5 * float((p * (p / m).log()).sum()) + 0.5 * float((q * (q / m).log()).sum())
    assert forward_kl(p.log(), q.log()).item() == pytest.approx(kl_pq, rel=1e-5)
    assert reverse_kl(p.log(), q.log()).item() == pytest.approx(kl_qp, rel=1e-5)
    assert total_variation(p.log(), q.log()).item() == pytest.approx(0.4, rel=1e-5)
    assert jensen_shannon(p.log(), q.log()).item() == pytest.approx(jsd, rel=1e-5)


def test_tvd_is_one_minus_acceptance():
    """1 - TVD = sum_x min(p, q): the probability that the rule accepts x ~ q."""
    g = torch.Generator().manual_seed(0)
    t, s = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    p, q = t.softmax(-1), s.softmax(-1)
    torch.testing.assert_close(1 - total_variation(t, s), torch.minimum(p, q).sum(-1))


def test_temperature_applies_to_both():
    t, s = torch.randn(3, 7), torch.randn(3, 7)
    torch.testing.assert_close(forward_kl(t, s, temperature=2.0), forward_kl(t / 2, s / 2))


def test_unknown_objective():
    with pytest.raises(UserInputError, match="objective 'l2' is unknown; allowed: forward_kl, reverse_kl, tvd, jsd"):
        objective("l2")
