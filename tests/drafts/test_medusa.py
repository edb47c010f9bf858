"""Medusa heads: each round's proposal reads the committed state before the tip, as training
does; save/load round trips; bad heads and K are one-line errors; Lightning training raises
held-out alpha; `student=medusa` -> `draft=medusa` end to end. (Greedy identity and chi-square
exactness: the medusa kinds of tests/drafters.py in test_engine.py and test_exactness.py.)"""

import json

import lightning as L
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.features import FeatureDistillModule, medusa_student, teacher_pass
from specexp.drafts.medusa import MedusaDrafter, medusa_drafter
from specexp.drafts.parts.medusa_heads import MedusaHeads
from specexp.errors import UserInputError
from tests.commands import on_tiny_local_target, run_distill, run_smoke_study
from tests.conftest import tiny_model
from tests.distilling import fit_and_validate, toy_corpus_args
from tests.drafters import RecordsProposals, every_other_token, medusa_heads

NO_EOS = [10**6]


class RecordingMedusa(RecordsProposals, MedusaDrafter):
    pass


@pytest.mark.parametrize("keep_every", [None, 2])
def test_proposals_read_the_state_before_the_tip(target, prompts, keep_every):
    """Head i's q each round is its distribution over transformers' last hidden state of the
    committed tokens before the tip, through ragged rewinds."""
    heads = medusa_heads(target, n_heads=3, keep_every=keep_every)
    drafter = RecordingMedusa(target, heads, k=3)
    out = generate(target.model, prompts, drafter, SamplingConfig(temperature=1.0), 16, NO_EOS,
                   torch.Generator().manual_seed(0))
    assert any((out.n_accepted[r] != out.n_accepted[r, 0]).any() for r in range(len(out.n_accepted)))  # ragged
    with torch.no_grad():
        for snapshot in drafter.rounds[:6]:
            for tokens, _, _, q in snapshot:
                state = target.model(tokens[None, :-1], output_hidden_states=True).hidden_states[-1][0, -1]  # [H]
                expected = torch.softmax(heads.target_logits(heads(state)).float(), -1)  # [3, V]
                torch.testing.assert_close(q, expected.to(q.dtype), rtol=1e-6, atol=1e-9)


def test_save_load_round_trip_and_errors(target, tmp_path):
    heads = medusa_heads(target, n_heads=3, keep_every=2)
    heads.save(tmp_path / "heads")
    loaded = MedusaHeads.load(tmp_path / "heads", target)
    assert sorted(p.name for p in (tmp_path / "heads").iterdir()) == ["draft_vocab.json", "medusa_head.json",
                                                                      "medusa_head.safetensors"]
    features = teacher_pass(target.model, torch.tensor([[5, 9, 2, 7]]), (2,))[1]
    with torch.no_grad():
        torch.testing.assert_close(loaded(features), heads(features), rtol=0, atol=0)
    assert (loaded.n_heads == 3
            and sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in heads.parameters()))

    with pytest.raises(UserInputError, match="medusa head .* was trained for another target") as error:
        MedusaHeads.load(tmp_path / "heads", tiny_model(0, layers=3))
    assert "\n" not in str(error.value)
    with pytest.raises(UserInputError, match=r"draft.k=4 is not allowed for a chain of 3 Medusa heads; give 1..3"):
        MedusaDrafter(target, loaded, k=4)
    MedusaDrafter(target, loaded, k=8, branches=2)  # a tree of 8 nodes, at most 3 levels
    with pytest.raises(UserInputError, match=r"Medusa heads read one layer's state; hidden_layers=\[1, 2\]"):
        MedusaHeads(target, (1, 2))
    with pytest.raises(UserInputError, match="no medusa_head.json there"):
        medusa_drafter(target, head=str(tmp_path / "nothing"))


def test_training_raises_heldout_alpha(sharp_pair, tmp_path):
    target, blocks = sharp_pair
    L.seed_everything(0)
    student = medusa_student(target, n_heads=3, draft_vocab=every_other_token(target, 2))
    module = FeatureDistillModule(student, target, "forward_kl", lr=1e-2, warmup_steps=2)
    before, after = fit_and_validate(tmp_path, module, blocks, steps=100)
    assert after["val/alpha"] > before["val/alpha"] + 0.05, (before, after)
    assert after["val/alpha_head2"] > before["val/alpha_head2"] + 0.03
    assert after["val/loss"] < before["val/loss"]
    drafter = MedusaDrafter(target, student.model.eval(), k=3)
    prompts = [[5, 6, 7, 8], [3, 4, 9]]
    alone = generate(target.model, prompts, None, SamplingConfig(), 12, NO_EOS)
    spec = generate(target.model, prompts, drafter, SamplingConfig(), 12, NO_EOS)
    # (2 tokens ahead of a random target, greedy matches ~6%: acceptance is test_engine's)
    assert spec.tokens == alone.tokens


@pytest.mark.default_target
def test_medusa_command_end_to_end(tmp_path, tiny_local_conf):
    """student=medusa at toy size on a user's own target (the shipped heads on the default target: the
    smoke k_sweep), then a priced study of the exported heads."""
    run_dir, tiny = tmp_path / "run", on_tiny_local_target(tiny_local_conf)
    out = run_distill(*tiny, "student=medusa", "student.n_heads=3", "draft_vocab_size=512", *toy_corpus_args(tmp_path),
                      "trainer.max_steps=4", "trainer.val_check_interval=2", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "teacher_top_k=64 unused; feature_cache=true caches them" in out.stdout  # a live target pass per step
    heads = run_dir / "student"
    assert json.loads((heads / "medusa_head.json").read_text())["n_heads"] == 3
    # the heads alone (the target has 3.2M)
    assert json.loads((run_dir / "result.json").read_text())["parameters"] < 100_000
    # a chain, K chosen per round up to its 3 heads (profiled no further); trees: test_engine, test_exactness
    study = run_smoke_study(*tiny, "draft=medusa", f"draft.head={heads}", "draft.k_max=3",
                            f"hydra.run.dir={tmp_path / 'study'}")
    assert study.returncode == 0, study.stderr[-3000:]
    assert json.loads((tmp_path / "study" / "summary.json").read_text())["greedy_match"] == 1.0
