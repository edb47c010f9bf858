"""A KV cache whose rows hold different numbers of valid tokens.

Rows of a batch accept different numbers of draft tokens, so after a round their tips
differ. Instead of realigning rows, every slot of the cache keeps a validity bit: rejected
entries are masked out of attention and rows take position ids from their own count of
valid tokens. Slots that are invalid in every row are cropped off the end, so with B == 1
the cache is always dense. The mask also carries left padding of the prompts.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass
class RaggedKV:
    cache: DynamicCache
    mask: torch.Tensor  # [B, L] long: 1 = slot holds a valid token of that row
    n_valid: torch.Tensor  # [B] long: valid tokens per row = position id of the next token

    @classmethod
    def empty(cls, model: PreTrainedModel, batch_size: int, device: torch.device) -> "RaggedKV":
        return cls(
            cache=DynamicCache(config=model.config),
            mask=torch.zeros(batch_size, 0, dtype=torch.long, device=device),
            n_valid=torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    def forward(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,  # [B, T]
        input_mask: torch.Tensor | None = None,  # [B, T]: 0 for (left) padding
        logits_to_keep: int = 1,
    ) -> torch.Tensor:
        """Append T tokens per row and return the logits of the last ``logits_to_keep`` [B, n, V]."""
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        positions = self.extend(input_mask)
        out = model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        return out.logits

    def extend(self, input_mask: torch.Tensor) -> torch.Tensor:
        """Book T new slots per row ([B, T] mask, 0 = padding); returns their position ids [B, T].

        For callers that run the model's layers themselves (the shared early-exit cache)."""
        positions = self.n_valid[:, None] + input_mask.cumsum(1) - 1  # [B, T]
        self.mask = torch.cat([self.mask, input_mask], dim=1)  # [B, L+T]
        self.n_valid = self.n_valid + input_mask.sum(1)
        return positions.clamp_min(0)

    def drop_last(self, n_drop: torch.Tensor) -> None:
        """Invalidate the last ``n_drop[b]`` valid tokens of each row b ([B] long)."""
        after = self.mask.flip(1).cumsum(1).flip(1)  # [B, L]: valid slots at or after each slot
        self.mask = self.mask * (after > n_drop[:, None])
        self.n_valid = self.n_valid - n_drop
        # Physically drop the tail that no row uses any more (one host sync per call).
        L = self.mask.shape[1]
        slot_number = torch.arange(1, L + 1, device=self.mask.device)  # [L]
        length = int((self.mask.any(0) * slot_number).max()) if L else 0
        trailing = L - length
        if trailing > 0:
            self.cache.crop(-trailing)
            self.mask = self.mask[:, :length]
