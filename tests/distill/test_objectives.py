"""Distillation objectives against direct computations."""

import math

import pytest
import torch

from specexp.distill.objectives import (
    coarsen,
    forward_kl,
    jensen_shannon,
    objective,
    reverse_kl,
    top_k_targets,
    total_variation,
    warped_log_probs,
    with_rest,
)
from specexp.errors import UserInputError

ALL = (forward_kl, reverse_kl, total_variation, jensen_shannon)


def test_identical_distributions_have_zero_divergence():
    log_p = warped_log_probs(torch.randn(5, 11))
    for fn in ALL:
        torch.testing.assert_close(fn(log_p, log_p), torch.zeros(5), atol=1e-6, rtol=0)


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
    torch.testing.assert_close(1 - total_variation(warped_log_probs(t), warped_log_probs(s)),
                               torch.minimum(p, q).sum(-1))


def test_temperature_divides_logits():
    t = torch.randn(3, 7)
    torch.testing.assert_close(warped_log_probs(t, 2.0), torch.log_softmax(t / 2, -1))


def test_top_k_coarsening_keeps_mass_and_lower_bounds_the_divergence():
    g = torch.Generator().manual_seed(1)
    log_p = warped_log_probs(2 * torch.randn(6, 20, generator=g))
    log_q = warped_log_probs(2 * torch.randn(6, 20, generator=g))
    ids, top = top_k_targets(log_p, 5)
    assert ids.shape == (6, 5)
    torch.testing.assert_close(top, log_p.gather(-1, ids))
    p_k, q_k = with_rest(top), coarsen(log_q, ids)  # [6, 6]
    torch.testing.assert_close(p_k.exp().sum(-1), torch.ones(6))
    torch.testing.assert_close(q_k.exp().sum(-1), torch.ones(6))
    for fn in ALL:  # data-processing inequality: merging categories never increases a divergence
        assert (fn(p_k, q_k) <= fn(log_p, log_q) + 1e-6).all()
    full_ids, full = top_k_targets(log_p, 20)  # k = C loses nothing
    torch.testing.assert_close(total_variation(with_rest(full), coarsen(log_q, full_ids)),
                               total_variation(log_p, log_q), atol=1e-5, rtol=0)


def test_unknown_objective():
    with pytest.raises(UserInputError, match="objective 'l2' is unknown; allowed: forward_kl, reverse_kl, tvd, jsd"):
        objective("l2")
