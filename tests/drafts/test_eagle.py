"""EAGLE heads: drafting computes what training computes (the unrolled steps) through ragged
rewinds; save/load round trips; a head for another target or layer set is a one-line error;
Lightning training raises held-out alpha for both recipes; `student=eagle3` -> `draft=eagle`
end to end. (Greedy identity and chi-square exactness: the eagle kinds of tests/drafters.py in
test_engine.py and test_exactness.py.)"""

import json

import lightning as L
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.features import FeatureDistillModule, eagle3_student, eagle_student, teacher_pass
from specexp.draft_vocab import DraftVocab
from specexp.drafts.eagle import EagleDrafter, eagle_drafter
from specexp.drafts.parts.eagle_head import EagleHead, unrolled_mask
from specexp.errors import UserInputError
from tests.commands import on_tiny_local_target, run_distill, run_smoke_study
from tests.conftest import EOS, tiny_model
from tests.distilling import fit_and_validate, toy_corpus_args
from tests.drafters import RecordsProposals, ScriptedK, eagle_head

NO_EOS = [10**6]


class RecordingEagle(RecordsProposals, EagleDrafter):
    pass


@pytest.mark.parametrize("scripted", [False, True], ids=["k=3", "k-per-round"])
@pytest.mark.parametrize("layers", [(2,), (0, 1, 2)])
def test_drafting_equals_the_training_forward_through_ragged_rewinds(target, prompts, layers, scripted):
    """Round after round, a chain's q at step j is the unrolled training forward's step j over
    the committed tokens + the chain's first j-1 tokens (step 1: the last committed pair's); also
    when rounds skip the draft and K changes (pairs pile up), and beside a one-token prompt."""
    head = eagle_head(target, layers, keep_every=2 if len(layers) > 1 else None)
    drafter = RecordingEagle(target, head, k=3)
    policy = ScriptedK(seed=3) if scripted else None
    out = generate(target.model, [*prompts, [7]], drafter, SamplingConfig(temperature=1.0), 16, NO_EOS,
                   torch.Generator().manual_seed(0), k_policy=policy)
    if scripted:  # rounds without the draft between drafted ones: pairs pile up
        assert 0 in out.k_chosen and max(out.k_chosen) > 0
    else:
        assert any((out.n_accepted[r] != out.n_accepted[r, 0]).any() for r in range(len(out.n_accepted)))  # ragged
    checked = 0
    with torch.no_grad():
        for snapshot in drafter.rounds[:8]:
            for tokens, features, chain, q in snapshot:
                if len(tokens) < 2:  # a one-token prompt has no features before its first round
                    continue
                n = chain.shape[0]
                sequence = torch.cat([tokens, chain[: n - 1]])[None]  # [1, len + n - 1]
                # the tip's: none yet
                padded = torch.cat([features[:-1], features.new_zeros(n, features.shape[-1])])[None]
                steps = head.unrolled(sequence, padded, n)
                for j in range(n):  # step j+1's entry for the chain's token j (entry t reads token t+1)
                    logits = head.target_logits(steps[j][0][0, len(tokens) - 2 + j])
                    torch.testing.assert_close(q[j], torch.softmax(logits.float(), -1).to(q.dtype),
                                               rtol=1e-6, atol=1e-9)
                    checked += 1
    assert checked >= 3 * len(prompts) * 2  # at least two rounds of every row with features


def test_unrolled_mask_is_what_drafting_step_j_sees():
    mask = unrolled_mask(5, 3, torch.device("cpu"))[0, 0]  # [5, 15]: entries 0..4 of step 3
    t = 4  # step 3's entry at t: step 1's entries up to t - 2, step 2's at t - 1, itself
    assert mask[t, :5].tolist() == [True, True, True, False, False]
    assert mask[t, 5:10].tolist() == [False, False, False, True, False]
    assert mask[t, 10:].tolist() == [False, False, False, False, True]
    assert mask.any(-1).all()  # no entry sees nothing (SDPA would make NaNs)


def test_save_load_round_trip_and_errors(target, tmp_path):
    head = eagle_head(target, (0, 1, 2), keep_every=2)
    head.save(tmp_path / "head")
    loaded = EagleHead.load(tmp_path / "head", target)
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == ["draft_vocab.json", "eagle_head.json",
                                                                     "eagle_head.safetensors"]
    ids = torch.tensor([[5, 9, 2, 7, 7, 30]])
    features = teacher_pass(target.model, ids, (0, 1, 2))[1]
    with torch.no_grad():
        for (a, _), (b, _) in zip(head.unrolled(ids, features, 2), loaded.unrolled(ids, features, 2), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert loaded.hidden_layers == (0, 1, 2) and loaded.draft_vocab.size == head.draft_vocab.size
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in head.parameters())  # no target weights

    for other, why in ((tiny_model(0, layers=3), "layers"), (tiny_model(0, layers=2, vocab_size=80), "vocabulary"),
                       (tiny_model(0, layers=2, hidden=48), "hidden size")):
        with pytest.raises(UserInputError, match="was trained for another target") as error:
            EagleHead.load(tmp_path / "head", other)
        assert "\n" not in str(error.value), why
    with pytest.raises(UserInputError, match=r"hidden_layers=\[3\] is not allowed; give indices in 0..2"):
        EagleHead(target, (3,))
    with pytest.raises(UserInputError, match="no eagle_head.json there"):
        eagle_drafter(target, head=str(tmp_path / "nothing"))
    with pytest.raises(UserInputError, match=r"student.unroll_steps=0 is not allowed"):
        eagle_student(target, unroll_steps=0)
    with pytest.raises(UserInputError, match=r"feature_loss_weight=0.1 regresses .* hidden_layers=\[0, 2\] has 2"):
        eagle_student(target, hidden_layers=[0, 2], feature_loss_weight=0.1)


@pytest.mark.parametrize("recipe", ["eagle", "eagle3_fc", "eagle3"])
def test_training_raises_heldout_alpha(sharp_pair, tmp_path, recipe):
    """student=eagle (top state, feature regression), student=eagle3_fc (specexp's earlier variant: three
    layers fused through one fc, an "other" slot) and student=eagle3 (as published: the 2H-wide layer, the
    kept ids alone), each with a reduced vocabulary and unrolled steps, through the Lightning module."""
    target, blocks = sharp_pair
    L.seed_everything(0)
    vocab = DraftVocab(sorted(set(range(0, 64, 2)) | {EOS}), 64)
    if recipe == "eagle":
        student = eagle_student(target, feature_loss_weight=0.1)
    elif recipe == "eagle3_fc":
        student = eagle_student(target, hidden_layers=[0, 1, 2], unroll_steps=2, draft_vocab=vocab)
    else:
        student = eagle3_student(target, hidden_layers=[0, 1, 2], unroll_steps=2, draft_vocab=vocab)
    module = FeatureDistillModule(student, target, "forward_kl", lr=1e-2, warmup_steps=2)
    before, after = fit_and_validate(tmp_path, module, blocks, steps=100)
    assert after["val/alpha"] > before["val/alpha"] + 0.05, (before, after)
    assert after["val/loss"] < before["val/loss"]
    if recipe != "eagle":
        assert after["val/alpha_step2"] > before["val/alpha_step2"] + 0.05
    # the trained head drafts exactly (greedy)
    drafter = EagleDrafter(target, student.model.eval(), k=3)
    prompts = [[5, 6, 7, 8], [3, 4, 9]]
    alone = generate(target.model, prompts, None, SamplingConfig(), 12, NO_EOS)
    spec = generate(target.model, prompts, drafter, SamplingConfig(), 12, NO_EOS)
    assert spec.tokens == alone.tokens and int(spec.n_accepted.sum()) > 0


@pytest.mark.default_target
def test_eagle3_command_end_to_end(tmp_path, tiny_local_conf):
    """student=eagle3 at toy size on a user's own 8-layer target (the default's tokenizer) exports a
    head folder that draft=eagle runs exactly as a dynamic tree with int8 linears (the shipped head
    on the default target, as chains: the smoke k_sweep and draft_compare)."""
    run_dir, tiny = tmp_path / "run", on_tiny_local_target(tiny_local_conf)
    out = run_distill(*tiny, "student=eagle3", "student.intermediate_size=256", "draft_vocab_size=512",
                      "feature_cache=true", *toy_corpus_args(tmp_path), "trainer.max_steps=4",
                      "trainer.val_check_interval=2", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "feature cache: hidden states [2, 4, 5, 8] of" in out.stdout and "writing it now" in out.stdout
    caches = [p for p in (tmp_path / "cache").glob("corpus-*-features-*") if (p / "dataset_info.json").exists()]
    assert len(caches) == 1 and not list((tmp_path / "cache").glob("*.map.arrow"))  # no second copy left behind
    head = run_dir / "student"
    config = json.loads((head / "config.json").read_text())  # the speculators format vLLM serves
    # the toy corpus's ids
    assert config["speculators_model_type"] == "eagle3" and 0 < config["draft_vocab_size"] <= 512
    assert config["eagle_aux_hidden_state_layer_ids"] is None  # the published default: 2, N/2, N-3 = 2, 4, 5
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 4 and result["parameters"] < 200_000  # the head alone (the target has 3.2M)
    # a fixed node budget, unpriced: the export is under test (a priced study of a fresh head: test_medusa's)
    study = run_smoke_study(*tiny, "draft=eagle", f"draft.head={head}", "draft.branches=2", "draft.k=4",
                            "draft.quantize=int8", "profile.enabled=false", f"hydra.run.dir={tmp_path / 'study'}")
    assert study.returncode == 0, study.stderr[-3000:]
    summary = json.loads((tmp_path / "study" / "summary.json").read_text())
    assert summary["greedy_match"] == 1.0
    assert summary["runtime"]["draft_int8_linears"] >= 6  # fusion, the layer's q/k/v/o and MLP, its own head
    bad = run_distill(*tiny, "feature_cache=true", *toy_corpus_args(tmp_path), f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "feature_cache=true caches a feature head's inputs; student" in bad.stderr


@pytest.mark.parametrize("recipe", ["eagle3", "medusa"])
def test_a_feature_cache_gives_the_live_passes_teacher_and_features(sharp_pair, recipe, tmp_path):
    """feature_cache=true: the cached hidden states give the same teacher logits (its head over
    the cached normed last state), features and training loss as a live target pass, for a head
    that reads the last state (Medusa) and one that does not (EAGLE-3: cached beside its layers)."""
    from specexp.distill.features import cached_layers, feature_cache_bytes, medusa_student, with_target_features

    target, blocks = sharp_pair
    blocks = blocks.select(range(6))
    student = (medusa_student(target, n_heads=2) if recipe == "medusa"
               else eagle_student(target, hidden_layers=[0, 1], unroll_steps=2))
    head = student.model
    layers = cached_layers(head.hidden_layers, 2)
    assert layers == ((2,) if recipe == "medusa" else (0, 1, 2))
    scratch = tmp_path / "map.arrow"
    cached = with_target_features(blocks, target, layers, batch_size=4, scratch_file=scratch).with_format("torch")
    assert scratch.exists() and cached[0]["features"].shape == (32, len(layers) * 32)
    # the size printed first (float32)
    assert feature_cache_bytes(6, 32, layers, 32) == cached[:]['features'].numel() * 4
    batch = {"input_ids": cached[:4]["input_ids"], "features": cached[:4]["features"]}
    module = FeatureDistillModule(student, target, "forward_kl", lr=1e-2, warmup_steps=2)
    live_logits, live_features = teacher_pass(target.model, batch["input_ids"], head.hidden_layers)
    logits, features, _ = module._passes(batch)
    torch.testing.assert_close(logits, live_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(features, live_features, rtol=0, atol=0)
    L.seed_everything(0)
    cached_loss = module.training_step(batch, 0)
    live_loss = module.training_step({"input_ids": batch["input_ids"]}, 0)
    torch.testing.assert_close(cached_loss, live_loss, rtol=1e-5, atol=1e-6)


def test_fp32_heads_train_over_a_bf16_target():
    """Training keeps heads in fp32 whatever the target's dtype (bf16 on a GPU): the target's
    embedding and LM head are read across the dtypes."""
    from specexp.distill.features import medusa_student, prediction_losses
    from specexp.distill.objectives import objective

    target = tiny_model(0, layers=2)
    target.model.to(torch.bfloat16)
    for student in (eagle_student(target, feature_loss_weight=0.1), medusa_student(target, n_heads=2),
                    eagle3_student(target, hidden_layers=[0, 1, 2])):
        head = student.model
        ids = torch.randint(2, 64, (2, 8), generator=torch.Generator().manual_seed(0))
        teacher_logits, features = teacher_pass(target.model, ids, head.hidden_layers)
        losses = prediction_losses(head, head.predictions(ids, features), teacher_logits, objective("forward_kl"), 1.0)
        sum(losses).backward()
        assert head.dtype == torch.float32 and all(p.grad is not None for p in head.parameters())
