"""Distillation data: a corpus of token blocks in a `datasets.Dataset` (cached on disk), optional
teacher top-k log-probs per position, and the LightningDataModule that serves them.

The corpus is specexp.ngram.corpus.corpus_documents (text data sets and/or the target's own
answers); the offline default is `prompts: self`, so nothing overlaps the evaluation prompt sets.
"""

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import datasets
import lightning as L
import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import DataLoader

from specexp.distill.objectives import top_k_targets, warped_log_probs
from specexp.draft_vocab import DraftVocab, vocab_fingerprint
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.ngram.corpus import corpus_documents, join_documents, map_fingerprint
from specexp.output import short_hash
from specexp.paths import cache_root


def token_blocks(documents: list[list[int]], separator: int, block_size: int) -> datasets.Dataset:
    """The documents joined by the separator and cut into blocks: a Dataset with `input_ids` [T]."""
    stream = join_documents(documents, separator)
    n_blocks = len(stream) // block_size
    if not any(documents) or n_blocks < 2:
        raise UserInputError(
            f"the distillation corpus is empty or too small: {len(stream)} tokens give {n_blocks} blocks of "
            f"{block_size}; at least 2 are needed (one for validation)"
        )
    blocks = stream[: n_blocks * block_size].reshape(n_blocks, block_size)
    return datasets.Dataset.from_dict({"input_ids": blocks.tolist()})


def cached_dataset(path: Path, build: Callable[[], datasets.Dataset]) -> datasets.Dataset:
    """Load a Dataset saved at path, or build and save it (via a temporary folder, so a killed
    build leaves nothing that looks finished). A file lock makes concurrent runs (DDP ranks,
    parallel sweep jobs) wait for one build instead of racing."""
    with FileLock(str(path.with_name(path.name + ".lock"))):
        if not (path / "dataset_info.json").exists():
            dataset = build()
            staging = path.with_name(path.name + ".partial")
            shutil.rmtree(staging, ignore_errors=True)  # left by a killed build
            dataset.save_to_disk(str(staging))
            staging.rename(path)
    return datasets.load_from_disk(str(path))


def corpus_dataset(target: LoadedModel, corpus: dict, block_size: int,
                   cache_dir: str | None = None) -> datasets.Dataset:
    """The corpus as token blocks, cached under cache_dir (default: the specexp cache) by its config."""
    root = Path(cache_dir) if cache_dir else cache_root() / "distill"
    key = short_hash([target.name, vocab_fingerprint(target), corpus, block_size])
    root.mkdir(parents=True, exist_ok=True)
    return cached_dataset(root / f"corpus-{key}", lambda: token_blocks(
        corpus_documents(target, **corpus), target.eos_token_ids[0], block_size))


@torch.no_grad()
def with_teacher_top_k(dataset: datasets.Dataset, target: LoadedModel, k: int, temperature: float,
                       vocab: DraftVocab | None = None, batch_size: int = 8) -> datasets.Dataset:
    """Adds the target's top-k log-probs per position (in the student's vocabulary, at the
    objective's temperature): `teacher_ids` [T, k] and `teacher_log_probs` [T, k].

    One teacher pass per token for the whole run instead of one per step: on a CPU the teacher
    costs far more than a small student.
    """
    device = target.model.device

    def score(batch: dict) -> dict:
        ids = torch.as_tensor(batch["input_ids"], device=device)  # [b, T]
        log_p = warped_log_probs(target.model(input_ids=ids).logits, temperature)  # [b, T, V]
        if vocab is not None:
            log_p = vocab.coarsen_log_probs(log_p)  # [b, T, N+1]
        top_ids, top = top_k_targets(log_p.flatten(0, 1), k)  # [b*T, k]
        shape = (*ids.shape, top.shape[-1])
        return {"teacher_ids": top_ids.view(shape).int().cpu().numpy(),
                "teacher_log_probs": top.view(shape).cpu().numpy()}

    return dataset.map(score, batched=True, batch_size=batch_size, desc=f"teacher top-{k} log-probs",
                       new_fingerprint=map_fingerprint(dataset, "teacher", *teacher_key(target, k, temperature, vocab)))


def teacher_cache_path(corpus: datasets.Dataset, target: LoadedModel, k: int, temperature: float,
                       vocab: DraftVocab | None) -> Path:
    """Where a corpus's teacher scores live: next to it, keyed by everything that changes them."""
    return beside_corpus(corpus, "teacher", *teacher_key(target, k, temperature, vocab))


def teacher_key(target: LoadedModel, k: int, temperature: float, vocab: DraftVocab | None) -> tuple:
    """Everything a corpus's teacher scores depend on: the target, k, the temperature and the target
    ids a reduced student vocabulary keeps (None: the full vocabulary)."""
    vocab_ids = None if vocab is None else hashlib.sha256(vocab.target_ids.numpy().tobytes()).hexdigest()[:16]
    return target.name, k, temperature, vocab_ids


def beside_corpus(corpus: datasets.Dataset, kind: str, *key: object) -> Path:
    """A folder next to a cached corpus for what is derived from it, keyed by ``key``."""
    corpus_dir = Path(corpus.cache_files[0]["filename"]).parent
    return corpus_dir.with_name(f"{corpus_dir.name}-{kind}-{short_hash(key)}")


class DistillDataModule(L.LightningDataModule):
    """Train/validation split of a token-block Dataset (with or without cached teacher columns)."""

    def __init__(self, dataset: datasets.Dataset, batch_size: int = 8, val_fraction: float = 0.1, seed: int = 0):
        super().__init__()
        self.dataset, self.batch_size, self.val_fraction, self.seed = dataset, batch_size, val_fraction, seed

    def setup(self, stage: str | None = None) -> None:
        n_val = max(1, int(round(len(self.dataset) * self.val_fraction)))
        split = self.dataset.with_format("torch").train_test_split(test_size=n_val, seed=self.seed)
        self.train_set, self.val_set = split["train"], split["test"]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        # Validation always scores against the live teacher (the full distribution), so only ids travel.
        return DataLoader(self.val_set.select_columns(["input_ids"]), batch_size=self.batch_size, shuffle=False)


def documents_from_blocks(dataset: datasets.Dataset) -> list[list[int]]:
    """The token blocks as documents (e.g. to count token frequencies)."""
    return [list(row) for row in np.asarray(dataset["input_ids"])]
