"""The LightningDataModule: fixed-length token blocks from a corpus, split into train/val."""

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from specexp.core.sampling import SamplingConfig
from specexp.data import mt_bench, prompts_from_dataset
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.ngram.corpus import generated_documents, join_documents, text_documents


def corpus_documents(target: LoadedModel, text: list[str] | None = None, text_column: str = "text",
                     prompts: str | None = None, prompt_limit: int | None = None, generation_tokens: int = 128,
                     temperature: float = 0.7, seed: int = 0) -> list[list[int]]:
    """Token documents from text data sets and/or the target's answers on a prompt set."""
    documents = []
    for source in text or []:
        documents += text_documents(target, source, text_column)
    if prompts:
        prompt_set = mt_bench(limit=prompt_limit, seed=seed) if prompts == "mt_bench" else \
            prompts_from_dataset(prompts, text_column="turns", limit=prompt_limit, seed=seed)
        documents += generated_documents(target, prompt_set, generation_tokens, SamplingConfig(temperature=temperature),
                                         seed=seed)
    return documents


class DistillDataModule(L.LightningDataModule):
    def __init__(self, documents: list[list[int]], separator: int, block_size: int = 128, batch_size: int = 8,
                 val_fraction: float = 0.1, seed: int = 0):
        super().__init__()
        self.documents, self.separator = documents, separator
        self.block_size, self.batch_size = block_size, batch_size
        self.val_fraction, self.seed = val_fraction, seed

    def setup(self, stage: str | None = None) -> None:
        stream = join_documents(self.documents, self.separator)
        n_blocks = len(stream) // self.block_size
        if not any(self.documents) or n_blocks < 2:
            raise UserInputError(
                f"the distillation corpus is empty or too small: {len(stream)} tokens give {n_blocks} blocks of "
                f"{self.block_size}; at least 2 are needed (one for validation)"
            )
        blocks = torch.from_numpy(stream[: n_blocks * self.block_size].reshape(n_blocks, self.block_size))
        order = torch.from_numpy(np.random.default_rng(self.seed).permutation(n_blocks))
        n_val = max(1, int(round(n_blocks * self.val_fraction)))
        self.val_blocks, self.train_blocks = blocks[order[:n_val]], blocks[order[n_val:]]

    def _loader(self, blocks: torch.Tensor, shuffle: bool) -> DataLoader:
        dataset = TensorDataset(blocks)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle,
                          collate_fn=lambda rows: {"input_ids": torch.stack([r[0] for r in rows]),
                                                   "attention_mask": torch.ones(len(rows), self.block_size,
                                                                                dtype=torch.long)})

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_blocks, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_blocks, shuffle=False)
