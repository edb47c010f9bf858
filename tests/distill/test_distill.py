"""Draft distillation: training improves the student (live or cached teacher, off- or on-policy,
full or reduced vocabulary), exports load as exact small_lm drafts, resume continues from the
saved step, and bad input is refused."""

import copy
import dataclasses
import json

import lightning as L
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.__main__ import export_student
from specexp.distill.data import DistillDataModule, documents_from_blocks, token_blocks, with_teacher_top_k
from specexp.distill.module import DistillModule, is_on_policy_step
from specexp.distill.student import build_student, student_from_target
from specexp.draft_vocab import DraftVocab, frequent_tokens
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError
from specexp.models import load_model
from specexp.ngram.corpus import corpus_documents, self_written_prompts, user_turn_prefix
from specexp.output import markdown_table
from specexp.reporting.job_table import collect, distillation_table
from tests.commands import on_tiny_local_target, run_distill, run_smoke_study, run_specexp
from tests.conftest import EOS, tiny_model
from tests.distilling import fit_and_validate, target_documents, toy_corpus_args, trainer

TINY_STUDENT = dict(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tiny_pair():
    target = tiny_model(0, layers=2, vocab_size=64, scale=3.0, dtype=torch.float32)
    return target, token_blocks(target_documents(target), EOS, 32)


@pytest.mark.parametrize("objective_name", ["tvd", "forward_kl", "reverse_kl", "jsd"])
def test_training_decreases_loss_and_heldout_tvd(tiny_pair, tmp_path, objective_name):
    target, blocks = tiny_pair
    L.seed_everything(0)
    module = DistillModule(build_student(target, **TINY_STUDENT), target, objective_name, lr=3e-3, warmup_steps=2)
    before, after = fit_and_validate(tmp_path, module, blocks)
    assert after["val/loss"] < before["val/loss"]
    assert after["val/tvd"] < before["val/tvd"] - 0.05
    assert after["val/alpha"] == pytest.approx(heldout_acceptance(module, blocks), abs=1e-4)


def heldout_acceptance(module, dataset) -> float:
    """E[sum_x min(p(x), q(x))] over the held-out positions, from both models' logits: the chance
    that one sampled draft token is accepted (Leviathan et al.), computed apart from the module."""
    data = DistillDataModule(dataset, batch_size=8)
    data.setup()
    accepted = []
    with torch.no_grad():
        for batch in data.val_dataloader():
            p = module.teacher(input_ids=batch["input_ids"]).logits.double().softmax(-1)
            q = module.student(input_ids=batch["input_ids"]).logits.double().softmax(-1)
            accepted.append(torch.minimum(p, q).sum(-1).flatten())
    return float(torch.cat(accepted).mean())


def test_cached_top_k_teacher_trains_as_well(tiny_pair, tmp_path):
    target, blocks = tiny_pair
    scored = with_teacher_top_k(blocks, target, k=32, temperature=1.0)  # this flat toy target needs half its vocab
    assert len(scored[0]["teacher_ids"]) == 32 and len(scored[0]["teacher_ids"][0]) == 32
    L.seed_everything(0)
    module = DistillModule(build_student(target, **TINY_STUDENT), target, "forward_kl", lr=3e-3, warmup_steps=2)
    before, after = fit_and_validate(tmp_path, module, scored)
    assert after["val/tvd"] < before["val/tvd"] - 0.04


def test_on_policy_steps_train_on_student_samples(tiny_pair, tmp_path):
    target, blocks = tiny_pair
    L.seed_everything(0)
    module = DistillModule(build_student(target, **TINY_STUDENT), target, "tvd", lr=3e-3, warmup_steps=2,
                           on_policy_ratio=1.0, on_policy_prefix=4)
    before, after = fit_and_validate(tmp_path, module, blocks, steps=40)
    assert after["val/tvd"] < before["val/tvd"] - 0.04


def test_on_policy_mix_follows_the_ratio_and_repeats():
    picks = [is_on_policy_step(0, step, 0.25) for step in range(2000)]
    assert 0.22 < sum(picks) / 2000 < 0.28  # binomial sd 0.0097: a 3-sd band
    assert picks == [is_on_policy_step(0, step, 0.25) for step in range(2000)]  # a resumed run picks the same
    assert picks != [is_on_policy_step(1, step, 0.25) for step in range(2000)]
    assert not any(is_on_policy_step(0, step, 0.0) for step in range(100))


def test_reduced_vocabulary_student_trains_and_exports_as_an_exact_draft(tmp_path):
    # sharp enough for 48 tokens to matter
    target = tiny_model(0, layers=2, vocab_size=64, scale=8.0, dtype=torch.float32)
    blocks = token_blocks(target_documents(target), EOS, 32)
    vocab = DraftVocab(frequent_tokens(documents_from_blocks(blocks), 48, [EOS]), target.vocab_size, "vocab_size=64")
    with torch.no_grad():  # the best a draft on these tokens can do: TVD >= P(token outside them)
        p = target.model(input_ids=torch.tensor(blocks["input_ids"])).logits.softmax(-1)
    floor = 1 - float(p[..., vocab.target_ids].sum(-1).mean())
    L.seed_everything(0)
    student = build_student(target, **TINY_STUDENT, draft_vocab=vocab)
    assert student.model.config.vocab_size == 49  # the kept tokens + "other"
    module = DistillModule(student, target, "forward_kl", lr=3e-3, warmup_steps=2)
    before, after = fit_and_validate(tmp_path, module, with_teacher_top_k(blocks, target, 16, 1.0, vocab), steps=200)
    assert after["val/tvd"] - floor < 0.75 * (before["val/tvd"] - floor)  # measured: ~0.5x
    export_student(student, tmp_path / "student", "float32")
    draft = load_model(str(tmp_path / "student"), dtype="float32", device="cpu")
    assert draft.draft_vocab.target_ids.tolist() == vocab.target_ids.tolist()
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    alone = generate(target.model, prompts, None, SamplingConfig(), 20, [10**6], torch.Generator().manual_seed(0))
    spec = generate(target.model, prompts, SmallLMDrafter(target, draft, k=3), SamplingConfig(), 20, [10**6],
                    torch.Generator().manual_seed(0))
    assert spec.tokens == alone.tokens
    assert int(spec.n_accepted[spec.active].sum()) > 0  # the trained student does agree sometimes


def test_resume_continues_from_the_saved_step(tiny_pair, tmp_path):
    target, blocks = tiny_pair

    def fit(max_steps: int, ckpt_path=None) -> tuple[L.Trainer, list[int]]:
        module = DistillModule(build_student(target, **TINY_STUDENT), target, "tvd", lr=3e-3, warmup_steps=2)
        starts = []
        start_probe = L.Callback()
        start_probe.on_train_start = lambda trainer, _module: starts.append(trainer.global_step)
        checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
        t = trainer(tmp_path, max_steps, callbacks=[checkpoint, start_probe])
        t.fit(module, datamodule=DistillDataModule(blocks, batch_size=8), ckpt_path=ckpt_path)
        return t, starts

    first, _ = fit(8)
    assert first.global_step == 8
    second, starts = fit(14, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert starts == [8] and second.global_step == 14
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["state_dict"]
    assert saved and not any(k.startswith("teacher.") for k in saved)  # student-sized checkpoints


def test_bad_inputs(tiny_pair, tmp_path):
    target, _ = tiny_pair
    tiny_model(3, vocab_size=80).model.save_pretrained(tmp_path / "other")
    with pytest.raises(UserInputError, match="vocab mismatch"):
        build_student(target, init_from=str(tmp_path / "other"))
    with pytest.raises(UserInputError, match="corpus is empty or too small"):
        token_blocks([], separator=EOS, block_size=32)
    with pytest.raises(UserInputError, match=r"student layers \[5\] must be indices in 0..1"):
        student_from_target(target, [5])


@pytest.mark.default_target
def test_self_written_user_turns_start_with_the_openers_in_turn():
    from specexp.models.embedded import load_embedded_target

    target = load_embedded_target("float32", "cpu")
    prompts = self_written_prompts(target, 3, max_tokens=6, batch_size=2, openers=["Write", "Explain"])
    assert [p.text.startswith(o) for p, o in zip(prompts, ["Write", "Explain", "Write"], strict=True)] == [True] * 3
    free = self_written_prompts(target, 2, max_tokens=6, batch_size=2)
    assert all(p.text for p in free)
    with pytest.raises(UserInputError, match=r"openers apply to prompts=self only .* prompts='mt_bench'"):
        corpus_documents(target, prompts="mt_bench", openers=["Write"])
    # a base model (no chat template, as Gemma-3-270M): it writes documents from the openers
    base = dataclasses.replace(target, tokenizer=copy.deepcopy(target.tokenizer))
    base.tokenizer.chat_template = None
    assert user_turn_prefix(base.tokenizer) == base.tokenizer("")["input_ids"]
    assert all(p.text.startswith("Solve") for p in self_written_prompts(base, 2, max_tokens=6, openers=["Solve"]))


def test_distill_command_end_to_end(tmp_path, tiny_local_conf):
    """Every source and option at toy size on a user's own target (a tiny Llama of the default's
    tokenizer: the command's path, not the target's size, is under test; the default target's:
    the distill_ablation notebook's smoke sweep), then the export as a draft."""
    run_dir, tiny = tmp_path / "run", on_tiny_local_target(tiny_local_conf)
    args = [*tiny, "student=from_target", "draft_vocab_size=512", "teacher_top_k=16", "on_policy.ratio=0.5",
            *toy_corpus_args(tmp_path), "trainer.max_steps=6", "trainer.val_check_interval=3",
            "trainer.log_every_n_steps=1", "trainer_logger=csv", f"hydra.run.dir={run_dir}"]
    out = run_distill(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("student exported to" in out.stdout
            and "decode with it: python -m specexp draft=small_lm draft.model=" in out.stdout)
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    header = next((run_dir / "logs").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "val/alpha" in header and "lr-AdamW" in header  # the logger got the metric and the LR
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history] == [3, 6] and all(0 <= row["val/alpha"] <= 1 for row in history)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 6 and 16 < result["draft_vocab_size"] <= 512
    config = json.loads((run_dir / "student" / "config.json").read_text())
    assert config["vocab_size"] == result["draft_vocab_size"] + 1 and config["num_hidden_layers"] == 2
    teacher_caches = [p for p in (tmp_path / "cache").glob("corpus-*-teacher-*") if (p / "dataset_info.json").exists()]
    assert len(teacher_caches) == 1  # cached for the next run
    table = distillation_table(collect([tmp_path]))
    assert len(table) == 1 and table.iloc[0]["best_alpha"] == result["best_alpha"]
    assert table.iloc[0]["student"] == "from_target" and table.iloc[0]["on_policy.ratio"] == "0.5"
    header = markdown_table(table).splitlines()[0]
    assert "best_alpha" in header and "greedy_match" in header and "path" not in header.split(" | ")

    # at a fixed K, unpriced: the export is under test (a priced study: test_cli's default study)
    study = run_smoke_study(*tiny, "draft=small_lm", f"draft.model={run_dir / 'student'}", "draft.k=2",
                            "profile.enabled=false", f"hydra.run.dir={tmp_path / 'study'}")
    assert study.returncode == 0, study.stderr[-3000:]
    assert json.loads((tmp_path / "study" / "summary.json").read_text())["greedy_match"] == 1.0

    bad = run_distill("objective=l2", f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "objective 'l2' is unknown" in bad.stderr


def test_exit_head_command_end_to_end(tmp_path, tiny_local_conf):
    """student=exit_head trains a head over a tiny local target's layer 4 and exports a head
    folder (no model copy) that draft=early_exit runs exactly (the shipped heads on the default target: the
    exit-layer sweep)."""
    run_dir, tiny = tmp_path / "run", on_tiny_local_target(tiny_local_conf)
    out = run_distill(*tiny, "student=exit_head", "student.exit_layer=4", "student.adapter_size=32",
                      "draft_vocab_size=512", "teacher_top_k=16", *toy_corpus_args(tmp_path), "trainer.max_steps=4",
                      "trainer.val_check_interval=2", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    head = run_dir / "student"
    # the draft whose card says student=exit_head trains it, and where the folder goes
    assert f"decode with it: python -m specexp draft=early_exit draft.head={head}" in out.stdout
    assert sorted(p.name for p in head.iterdir()) == ["draft_vocab.json", "exit_head.json", "exit_head.safetensors"]
    assert json.loads((head / "exit_head.json").read_text())["exit_layer"] == 4
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 4 and result["parameters"] < 100_000  # the head alone, not the target (3.2M)
    # (both modes with a saved head, and on-policy refused: tests/drafts/test_early_exit.py)
    study = run_smoke_study(*tiny, "draft=early_exit", f"draft.head={head}", "draft.exit_layer=null", "draft.k=2",
                            "profile.enabled=false", f"hydra.run.dir={tmp_path / 'study'}")
    assert study.returncode == 0, study.stderr[-3000:]
    assert json.loads((tmp_path / "study" / "summary.json").read_text())["greedy_match"] == 1.0


def test_wandb_logger_gets_the_validation_alpha(tiny_pair, tmp_path, monkeypatch):
    """trainer_logger=wandb is Lightning's WandbLogger; offline, its run log holds val/alpha."""
    import time

    from hydra import compose, initialize_config_dir
    from lightning.pytorch.loggers import WandbLogger

    from specexp.paths import CONFIG_DIR
    from tests.wandb_reader import offline_run

    monkeypatch.setenv("WANDB_SILENT", "true")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("distill", overrides=["trainer_logger=wandb"])
    assert cfg.trainer_logger._target_ == "lightning.pytorch.loggers.WandbLogger"
    target, blocks = tiny_pair
    logger = WandbLogger(project="specexp", save_dir=str(tmp_path), mode="offline", job_type="distill")
    module = DistillModule(build_student(target, **TINY_STUDENT), target, "tvd", lr=3e-3, warmup_steps=2)
    trainer(tmp_path, 4, logger=logger, val_check_interval=2, check_val_every_n_epoch=None, log_every_n_steps=1,
            enable_checkpointing=False).fit(module, datamodule=DistillDataModule(blocks, batch_size=8))
    logger.experiment.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    deadline = time.time() + 120  # wandb's service process may still be appending the log after finish()
    while not (run := offline_run(run_dir))["finished"]:
        assert time.time() < deadline, "the offline run never recorded its exit"
        time.sleep(0.25)
    assert 0 < run["summary"].get("val/alpha", -1) <= 1 and "train/loss" in run["summary"], sorted(run["summary"])


def test_shipped_distilled_draft_is_small_and_refuses_other_targets(tiny_pair):
    from specexp.drafts.small_lm import DISTILLED_DRAFT, distilled_drafter

    weights = DISTILLED_DRAFT / "model.safetensors"
    assert weights.stat().st_size <= 30 * 2**20  # the limit for shipping it in the package
    assert (DISTILLED_DRAFT / "draft_vocab.json").is_file()
    target, _ = tiny_pair
    with pytest.raises(UserInputError, match="vocab mismatch"):
        distilled_drafter(target)


@pytest.mark.default_target
@pytest.mark.parametrize(("draft", "sampling"), [
    # in CI the smoke k_sweep's draft=distilled jobs (K = 1, 2, auto) check greedy identity on the same prompts
    pytest.param("distilled", "greedy", marks=pytest.mark.slow),
    ("distilled", "nucleus"), ("distilled_confident", "greedy")])
def test_shipped_distilled_draft_runs_exactly_on_the_default_target(tmp_path, draft, sampling):
    """On a CPU with int8 weights (quantize: auto); distilled_confident proposes up to 2 sure tokens.
    At a fixed K = 2 and unpriced: the shipped k=auto may rationally draft nothing in a 16-token smoke
    run (its cache fill would not pay), and this test is about the draft itself (a sampled study's
    profile and K chosen by it: the temperature_sweep notebook's smoke sweep)."""
    from hydra import compose, initialize_config_dir

    from specexp.paths import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        assert compose(config_name="config", overrides=[f"draft={draft}"]).draft.k == "auto"  # as shipped
    out = run_specexp(f"draft={draft}", "draft.k=2", f"sampling={sampling}", "size=smoke", "data.limit=2",
                      "max_new_tokens=16", "profile.enabled=false", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["draft"] == draft and summary["k_policy"] == "fixed" and summary["k_max"] == 2
    assert summary["alpha"] > 0
    if sampling == "greedy":
        assert summary["greedy_match"] == 1.0


def test_cache_is_built_once_by_concurrent_runs(tmp_path):
    """DDP ranks and parallel jobs share a corpus cache: one builds it, the others wait and load."""
    import threading
    import time

    import datasets

    from specexp.distill.data import cached_dataset

    builds = []

    def build():
        builds.append(1)
        time.sleep(0.5)
        return datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4]]})

    loaded = []
    threads = [threading.Thread(target=lambda: loaded.append(cached_dataset(tmp_path / "corpus", build)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and [len(d) for d in loaded] == [2, 2, 2]
    assert not (tmp_path / "corpus.partial").exists()
