"""draft=oracle: acceptance set by hand (per position), a real draft's cost, exact like every draft."""

import json

import numpy as np
import pytest
import torch

from specexp.core import metrics
from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.oracle import OracleDrafter
from specexp.errors import UserInputError
from specexp.study.references import greedy_continuations
from tests.commands import run_specexp

GREEDY = SamplingConfig()
NO_EOS = [10**6]


def oracle_run(target, prompts, alpha, k: int = 4, max_new: int = 40, seed: int = 0, cost_layers: int = 1):
    drafter = OracleDrafter(target, alpha=alpha, k=k, cost_layers=cost_layers, cost_hidden=32, seed=seed)
    drafter.set_reference(prompts, greedy_continuations(target.model, target, prompts, max_new, len(prompts)))
    spec = generate(target.model, prompts, drafter, GREEDY, max_new, NO_EOS, torch.Generator().manual_seed(0))
    alone = generate(target.model, prompts, None, GREEDY, max_new, NO_EOS, torch.Generator().manual_seed(0))
    return spec, alone


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_the_oracle_is_exact_and_accepts_what_it_was_told(target, prompts, alpha):
    spec, alone = oracle_run(target, prompts, alpha)
    assert spec.tokens == alone.tokens
    proposed, accepted = spec.n_proposed[spec.active].numpy(), spec.n_accepted[spec.active].numpy()
    if alpha == 1.0:  # every proposal is the target's own continuation
        assert (accepted == proposed).all() and proposed.sum() > 0
    if alpha == 0.0:  # every proposed token is a wrong one
        assert accepted.sum() == 0 and proposed.sum() > 0


def test_per_position_acceptance_matches_the_alphas_given():
    """alpha = (0.8, 0.4): position 1 accepted 80% of the rounds, position 2 40% of those that got
    there. Over ~750 rounds at position 1 (and ~600 at position 2) the binomial standard errors are
    0.015 and 0.020; 4.5 of them (false failure < 1e-5 per check) bound the differences."""
    from tests.conftest import tiny_model

    target = tiny_model(3, layers=1)
    prompts = [[5 + i, 6, 7] for i in range(16)]
    spec, alone = oracle_run(target, prompts, [0.8, 0.4], k=2, max_new=100, cost_layers=0)
    assert spec.tokens == alone.tokens
    rows = spec.active.numpy()
    curve = metrics.acceptance_curve(spec.n_proposed.numpy()[rows], spec.n_accepted.numpy()[rows], 2)
    reached = int((spec.n_proposed.numpy()[rows] >= 1).sum())
    assert reached > 600
    assert abs(curve[0] - 0.8) < 4.5 * np.sqrt(0.8 * 0.2 / reached)
    assert abs(curve[1] - 0.4) < 4.5 * np.sqrt(0.4 * 0.6 / (0.8 * reached))


def test_the_oracle_refuses_sampling_and_bad_alphas(target, prompts):
    drafter = OracleDrafter(target, alpha=0.5, k=2, cost_layers=0)
    drafter.set_reference(prompts, greedy_continuations(target.model, target, prompts, 8, len(prompts)))
    with pytest.raises(UserInputError, match="greedy"):
        generate(target.model, prompts, drafter, SamplingConfig(temperature=0.7), 8, NO_EOS, torch.Generator())
    for alpha in (1.5, [], [0.5, -0.1]):
        with pytest.raises(UserInputError, match="draft.alpha"):
            OracleDrafter(target, alpha=alpha)


@pytest.mark.default_target
def test_a_study_with_the_oracle_runs_priced_and_refuses_sampling(tmp_path):
    run = run_specexp("draft=oracle", "draft.alpha=1.0", "draft.k=3", "size=smoke", f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["alpha"] == 1.0 and summary["greedy_match"] == 1.0 and summary["predicted_speedup"] is not None
    bad = run_specexp("draft=oracle", "sampling=nucleus", "size=smoke", f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "needs greedy decoding" in bad.stderr and not (tmp_path / "bad").exists()
