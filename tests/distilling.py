"""Helpers for the distillation tests (and the feature-head and exit-head tests that train too):
the target's own text, a quiet CPU Trainer, held-out metrics around a fit, a toy corpus."""

import lightning as L
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.data import DistillDataModule
from tests.conftest import EOS


def target_documents(target, n: int = 48, length: int = 40, seed: int = 0) -> list[list[int]]:
    """The target's own sampled text: what the student should learn to imitate."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, target.vocab_size, (3,), generator=g).tolist() for _ in range(n)]
    out = generate(target.model, prompts, None, SamplingConfig(temperature=1.0), length, [EOS], g)
    return [p + t for p, t in zip(prompts, out.tokens, strict=True)]


def trainer(tmp_path, max_steps: int, **kwargs) -> L.Trainer:
    kwargs = {"logger": False, **kwargs}
    return L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path), **kwargs)


def fit_and_validate(tmp_path, module, dataset, steps: int = 60) -> tuple[dict, dict]:
    """Held-out metrics before and after `steps` training steps."""
    data = DistillDataModule(dataset, batch_size=8)
    before = trainer(tmp_path, 1).validate(module, datamodule=data, verbose=False)[0]
    trainer(tmp_path, steps, enable_checkpointing=False).fit(module, datamodule=data)
    after = trainer(tmp_path, 1).validate(module, datamodule=data, verbose=False)[0]
    return before, after


def toy_corpus_args(tmp_path) -> list[str]:
    """A toy-sized corpus (the target's own chats + a text file) cached under tmp_path."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"Step {i}: the quick brown fox jumps over the lazy dog {i} times."
                                for i in range(100)))
    return ["data.corpus.prompt_limit=4", "data.corpus.prompt_tokens=12", "data.corpus.generation_tokens=16",
            f"data.corpus.text=[{corpus}]", "data.block_size=32", f"data.cache_dir={tmp_path / 'cache'}"]
