"""Chi-square goodness-of-fit tests and their power, for the distribution tests (no scipy needed)."""

import math

import torch

from specexp.core.sampling import SamplingConfig, logits_to_probs

# Each distribution test fails by chance with probability P_VALUE_THRESHOLD when the code is
# right; the suite runs < 100 such tests, so a correct build fails spuriously with probability
# < 100 * 1e-4 = 1% for a fresh seed (the seeds are fixed, so a given build passes or fails
# deterministically).
P_VALUE_THRESHOLD = 1e-4


def _upper_gamma(a: float, x: float) -> float:
    """Q(a, x): the regularised upper incomplete gamma function."""
    return float(torch.special.gammaincc(torch.tensor(a, dtype=torch.float64), torch.tensor(x, dtype=torch.float64)))


def chi2_sf(stat: float, dof: int) -> float:
    """P(X > stat) for X ~ chi-square with ``dof`` degrees of freedom."""
    return _upper_gamma(dof / 2.0, stat / 2.0)


def _pooled_cells(observed: torch.Tensor, expected_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Observed and expected counts with cells expecting < 5 pooled into one (the chi-square
    approximation needs >= 5 per cell); asserts nothing lands where p is exactly 0."""
    observed = observed.double()
    n = observed.sum()
    expected = expected_probs.double() / expected_probs.sum() * n
    assert observed[expected == 0].sum() == 0, "a token (sequence) of probability 0 was emitted"
    small = (expected < 5) & (expected > 0)
    obs = torch.cat([observed[expected >= 5], observed[small].sum()[None]])
    exp = torch.cat([expected[expected >= 5], expected[small].sum()[None]])
    keep = exp > 0
    return obs[keep], exp[keep]


def chi_square_stat(observed: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom for counts [C] against probabilities [C]."""
    obs, exp = _pooled_cells(observed, expected_probs)
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value that ``observed`` counts [C] come from ``expected_probs`` [C].

    Cells of zero expected probability must be empty (exactness, checked separately);
    cells expecting fewer than 5 counts are pooled so the chi-square approximation holds.
    """
    return chi2_sf(*chi_square_stat(observed, expected_probs))


def grouped_chi_square(observed: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    """p-value and degrees of freedom that each row of counts [G, C] comes from its row of
    probabilities [G, C] (independent multinomials: the statistics and dofs add up)."""
    stats = [chi_square_stat(o, e) for o, e in zip(observed, expected_probs, strict=True)]
    stat, dof = sum(s for s, _ in stats), sum(d for _, d in stats)
    return chi2_sf(stat, dof), dof


def noncentral_chi2_sf(stat: float, dof: int, noncentrality: float) -> float:
    """P(X > stat) for a noncentral chi-square: a Poisson(lambda / 2) mixture of central ones."""
    half = noncentrality / 2.0
    last = int(half + 12 * math.sqrt(half + 1) + 30)
    total = 0.0
    for j in range(last + 1):
        weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) if half > 0 else float(j == 0)
        total += weight * chi2_sf(stat, dof + 2 * j)
    return total


def _bisect(f, lo: float, hi: float, steps: int = 60) -> float:
    """The x in [lo, hi] where the increasing f crosses 0."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return hi


def detectable_tvd(n_per_group: int, dof: int, threshold: float = P_VALUE_THRESHOLD, power: float = 0.9) -> float:
    """The smallest total-variation distance from the expected distribution, in any one group of
    ``n_per_group`` draws, that a chi-square test with ``dof`` degrees of freedom at the given
    threshold detects with probability ``power`` (asymptotically).

    A deviation of TVD d has chi-square divergence >= 4 d^2 (Cauchy-Schwarz), so the test's
    noncentrality is >= n 4 d^2; solve for the noncentrality that gives ``power``.
    """
    critical = _bisect(lambda x: threshold - chi2_sf(x, dof), 0.0, 10.0 * dof + 200.0)
    needed = _bisect(lambda lam: noncentral_chi2_sf(critical, dof, lam) - power, 0.0, 10.0 * dof + 500.0)
    return math.sqrt(needed / (4.0 * n_per_group))


@torch.no_grad()
def exact_joint(target, prompt: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """P(t1, t2, t3 | prompt) under the warped target of V tokens, flattened [V^3]: every continuation
    of up to two tokens in one padding-free batch."""
    V = target.vocab_size
    prefixes = [[]] + [[a] for a in range(V)] + [[a, b] for a in range(V) for b in range(V)]
    probs = [logits_to_probs(target.model(torch.tensor([prompt + x])).logits[0, -1], sampling) for x in prefixes]
    p1, p2, p3 = probs[0], torch.stack(probs[1 : 1 + V]), torch.stack(probs[1 + V :]).view(V, V, V)
    return (p1[:, None, None] * p2[:, :, None] * p3).flatten()
