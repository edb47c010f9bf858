"""KV caches whose rows hold different numbers of valid tokens.

Rows of a batch accept different numbers of draft tokens, so after a round their tips
differ. Instead of realigning rows, every slot of the cache keeps a validity bit: rejected
entries are masked out of attention and rows take position ids from their own count of
valid tokens. Slots that are invalid in every row are given back at the end, so with B == 1
the cache is always dense. The mask also carries left padding of the prompts.

Two stores with one contract (``forward``, ``extend``, ``update``, ``drop_last``, ``mask``,
``n_valid``): `StaticRaggedKV` preallocates every layer and rewinds by moving an end index
(the lean runtime's); `RaggedKV` wraps transformers' DynamicCache for transformers' forward
(runtime=hf), whose rewind crops tensors.
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

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one layer's K/V [B, H_kv, T, hd]; returns all of that layer's [B, H_kv, S+T, hd]."""
        return self.cache.update(keys, values, layer_idx)

    def drop_last(self, n_drop: torch.Tensor) -> None:
        """Invalidate the last ``n_drop[b]`` valid tokens of each row b ([B] long)."""
        self.mask, length = kept_length(self.mask, n_drop)
        self.n_valid = self.n_valid - n_drop
        # Physically drop the tail that no row uses any more.
        trailing = self.mask.shape[1] - length
        if trailing > 0:
            self.cache.crop(-trailing)
            self.mask = self.mask[:, :length]


def kept_length(mask: torch.Tensor, n_drop: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Invalidate the last ``n_drop[b]`` valid slots of each row of ``mask`` [B, L]; returns the
    new mask and how many leading slots some row still uses (one host sync)."""
    after = mask.flip(1).cumsum(1).flip(1)  # [B, L]: valid slots at or after each slot
    mask = mask * (after > n_drop[:, None])
    L = mask.shape[1]
    slot_number = torch.arange(1, L + 1, device=mask.device)  # [L]
    return mask, int((mask.any(0) * slot_number).max()) if L else 0


class StaticRaggedKV:
    """The ragged contract over preallocated buffers: every layer's K/V lives in one
    [N, B, H_kv, C, hd] tensor, appends write in place, and a rewind clears validity bits and
    moves the end index: no K/V is copied or concatenated. Capacity C is sized by the caller from
    the prompt length, max_new_tokens and K; a run that needs more (holes left by ragged rows)
    doubles it, so appends stay amortised O(T).

    Layers may hold different numbers of slots (a shared early-exit draft appends to layers
    0..L-1 only); ``mask`` covers the longest, and a layer's attention reads its own prefix.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (n_layers, batch_size, n_kv_heads, max(capacity, 1), head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(batch_size, shape[3], dtype=torch.long, device=device)  # [B, C]
        self.length = 0  # slots booked by extend (the mask's width)
        self.layer_length = [0] * n_layers  # slots written per layer
        self.n_valid = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]

    @classmethod
    def for_model(cls, model, batch_size: int, capacity: int, device: torch.device) -> "StaticRaggedKV":
        config = model.config.get_text_config()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, batch_size, config.num_key_value_heads, head_dim, capacity, model.dtype,
                   device)

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def mask(self) -> torch.Tensor:
        return self.valid[:, : self.length]  # [B, L]

    def reserve(self, slots: int) -> None:
        """Make room for ``slots`` slots (doubling), keeping what is held."""
        if slots <= self.capacity:
            return
        N, B, H, C, hd = self.keys.shape
        grow = max(slots, 2 * C) - C
        self.keys = torch.cat([self.keys, self.keys.new_zeros(N, B, H, grow, hd)], dim=3)
        self.values = torch.cat([self.values, self.values.new_zeros(N, B, H, grow, hd)], dim=3)
        self.valid = torch.cat([self.valid, self.valid.new_zeros(self.valid.shape[0], grow)], dim=1)

    def extend(self, input_mask: torch.Tensor) -> torch.Tensor:
        """Book T new slots per row ([B, T] mask, 0 = padding); returns their position ids [B, T]."""
        T = input_mask.shape[1]
        self.reserve(self.length + T)
        positions = self.n_valid[:, None] + input_mask.cumsum(1) - 1  # [B, T]
        self.valid[:, self.length : self.length + T] = input_mask
        self.length += T
        self.n_valid = self.n_valid + input_mask.sum(1)
        return positions.clamp_min(0)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's K/V [B, H_kv, T, hd] after its last slot; returns views of all of that
        layer's slots [B, H_kv, S+T, hd]."""
        start, T = self.layer_length[layer_idx], keys.shape[2]
        self.reserve(start + T)
        self.keys[layer_idx, :, :, start : start + T] = keys
        self.values[layer_idx, :, :, start : start + T] = values
        self.layer_length[layer_idx] = start + T
        return self.keys[layer_idx, :, :, : start + T], self.values[layer_idx, :, :, : start + T]

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | None = None,
                logits_to_keep: int = 1) -> torch.Tensor:
        """Append T tokens per row and return the logits of the last ``logits_to_keep`` [B, n, V]."""
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        positions = self.extend(input_mask)
        return model(input_ids=input_ids, attention_mask=self.mask, position_ids=positions, cache=self,
                     logits_to_keep=logits_to_keep).logits

    def drop_last(self, n_drop: torch.Tensor) -> None:
        """Invalidate the last ``n_drop[b]`` valid tokens of each row b ([B] long)."""
        mask, length = kept_length(self.mask, n_drop)
        self.valid[:, : self.length] = mask
        self.n_valid = self.n_valid - n_drop
        self.length = length
        self.layer_length = [min(n, length) for n in self.layer_length]


def new_ragged_kv(model, batch_size: int, device: torch.device, capacity: int) -> "RaggedKV | StaticRaggedKV":
    """The cache a forward takes: preallocated for the lean runtime's, a DynamicCache for
    transformers' (whose attention wants a transformers Cache)."""
    if getattr(model, "takes_static_cache", False):
        return StaticRaggedKV.for_model(model, batch_size, capacity, device)
    return RaggedKV.empty(model, batch_size, device)
