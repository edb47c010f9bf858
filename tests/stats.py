"""A chi-square goodness-of-fit test for the distribution tests (no scipy needed)."""

import torch

# Each distribution test fails by chance with probability P_VALUE_THRESHOLD when the code is
# right; the suite runs < 40 such tests, so a correct build fails spuriously with probability
# < 40 * 1e-4 = 0.4% for a fresh seed (the seeds are fixed, so a given build passes or fails
# deterministically).
P_VALUE_THRESHOLD = 1e-4


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value that ``observed`` counts [C] come from ``expected_probs`` [C].

    Cells of zero expected probability must be empty (exactness, checked separately);
    cells expecting fewer than 5 counts are pooled so the chi-square approximation holds.
    """
    observed = observed.double()
    n = observed.sum()
    expected = expected_probs.double() / expected_probs.sum() * n
    assert observed[expected == 0].sum() == 0, "a token of probability 0 was emitted"
    small = (expected < 5) & (expected > 0)
    obs = torch.cat([observed[expected >= 5], observed[small].sum()[None]])
    exp = torch.cat([expected[expected >= 5], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))
