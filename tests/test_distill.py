"""Draft distillation: training improves the student, exports load as exact small_lm drafts,
resume continues from the saved step, and bad input is refused."""

import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.data import DistillDataModule
from specexp.distill.module import DistillModule
from specexp.distill.student import build_student
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError
from specexp.models import load_model
from tests.conftest import EOS, tiny_model

REPO = Path(__file__).resolve().parent.parent


def target_documents(target, n: int = 48, length: int = 40, seed: int = 0) -> list[list[int]]:
    """The target's own sampled text: what the student should learn to imitate."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, target.vocab_size, (3,), generator=g).tolist() for _ in range(n)]
    out = generate(target.model, prompts, None, SamplingConfig(temperature=1.0), length, [EOS], g)
    return [p + t for p, t in zip(prompts, out.tokens, strict=True)]


def trainer(tmp_path, max_steps: int, **kwargs) -> L.Trainer:
    return L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path), **kwargs)


@pytest.fixture(scope="module")
def tiny_pair():
    target = tiny_model(0, layers=2, vocab_size=64, scale=3.0)
    target.model.float()
    return target, target_documents(target)


@pytest.mark.parametrize("objective_name", ["tvd", "forward_kl", "reverse_kl", "jsd"])
def test_training_decreases_loss_and_heldout_tvd(tiny_pair, tmp_path, objective_name):
    target, documents = tiny_pair
    L.seed_everything(0)
    student = build_student(target, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
    module = DistillModule(student, target.model, objective_name, lr=3e-3, warmup_steps=2)
    data = DistillDataModule(documents, separator=EOS, block_size=32, batch_size=8)
    before = trainer(tmp_path, 1).validate(module, datamodule=data, verbose=False)[0]
    trainer(tmp_path, 60, enable_checkpointing=False).fit(module, datamodule=data)
    after = trainer(tmp_path, 1).validate(module, datamodule=data, verbose=False)[0]
    assert after["val/loss"] < before["val/loss"]
    assert after["val/tvd"] < before["val/tvd"] - 0.05
    assert after["val/alpha"] == pytest.approx(1 - after["val/tvd"])


def test_exported_student_is_an_exact_small_lm_draft(tiny_pair, tmp_path):
    target, documents = tiny_pair
    student = build_student(target, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
    module = DistillModule(student, target.model, "tvd", lr=3e-3, warmup_steps=2)
    trainer(tmp_path, 30, enable_checkpointing=False).fit(
        module, datamodule=DistillDataModule(documents, separator=EOS, block_size=32, batch_size=8))
    student.save_pretrained(tmp_path / "student")
    draft = load_model(str(tmp_path / "student"), dtype="float32", device="cpu")
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    alone = generate(target.model, prompts, None, SamplingConfig(), 20, [10**6], torch.Generator().manual_seed(0))
    spec = generate(target.model, prompts, SmallLMDrafter(target, draft, k=3), SamplingConfig(), 20, [10**6],
                    torch.Generator().manual_seed(0))
    assert spec.tokens == alone.tokens
    assert int(spec.n_accepted[spec.active].sum()) > 0  # the trained student does agree sometimes


def test_resume_continues_from_the_saved_step(tiny_pair, tmp_path):
    target, documents = tiny_pair

    def fit(max_steps: int, ckpt_path=None) -> tuple[L.Trainer, list[int]]:
        student = build_student(target, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
        module = DistillModule(student, target.model, "tvd", lr=3e-3, warmup_steps=2)
        starts = []
        start_probe = L.Callback()
        start_probe.on_train_start = lambda trainer, _module: starts.append(trainer.global_step)
        checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
        t = trainer(tmp_path, max_steps, callbacks=[checkpoint, start_probe])
        t.fit(module, datamodule=DistillDataModule(documents, separator=EOS, block_size=32, batch_size=8),
              ckpt_path=ckpt_path)
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
        DistillDataModule([], separator=EOS, block_size=32).setup()


@pytest.mark.default_target
def test_distill_command_end_to_end(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"Step {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(300)))
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "specexp.distill", "data.corpus.prompts=null", f"data.corpus.text=[{corpus}]",
                          "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=1",
                          "student.hidden_size=64",
                          "student.intermediate_size=128", "data.loader.block_size=64", f"hydra.run.dir={run_dir}",
                          f"trainer_logger={{_target_:lightning.pytorch.loggers.CSVLogger,save_dir:{tmp_path / 'logs'}}}"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "student exported to" in out.stdout
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    (metrics_file,) = (tmp_path / "logs").rglob("metrics.csv")  # the logger got val/alpha and the LR
    header = metrics_file.read_text().splitlines()[0]
    assert "val/alpha" in header and "lr-AdamW" in header
    config = json.loads((run_dir / "student" / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 2
    bad = subprocess.run([sys.executable, "-m", "specexp.distill", "objective=l2", "data.corpus.prompts=null",
                          f"data.corpus.text=[{corpus}]", f"hydra.run.dir={tmp_path / 'bad'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "objective 'l2' is unknown" in bad.stderr
