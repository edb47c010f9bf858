"""runtime.compile=true: the lean decoder's pass over T new tokens as one compiled graph.

Static shapes make it compilable end to end and, on CUDA, replayable as a CUDA graph
(``mode="reduce-overhead"``): inside the graph the new keys and values are written in place at
slots [start, start + T) of the static cache (``start`` a tensor, so steps do not recompile),
and attention reads every slot of the cache's capacity, the mask hiding those no row holds.
T is padded up to a bucket (1, 2, 4, 8, ...): the padding tokens are written past the cache's
end, where no mask shows them and the next pass overwrites them, and their logits are dropped.
So a run compiles one graph per bucket (and batch size), each with the matmul plan of its rows.

Passes it does not take run eagerly through the same decoder: prompts longer than
``max_tokens``, a transformers cache, a shared early-exit draft's split passes (whose layers hold
different numbers of slots), token trees, passes whose hidden states a draft reads, and every pass
of a model with sliding-window layers (Gemma3: its window is over each row's positions, which the
full-capacity mask does not carry).
"""

from types import SimpleNamespace

import torch

from specexp.core.kv import StaticRaggedKV
from specexp.runtime.decoder import LeanDecoder


def full_capacity_mask(valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Slot validity [B, C] and the new tokens' slots [T] -> which slots each new query sees
    [B, 1, T, C]: valid ones at or before its own. A query that sees nothing (left padding) sees
    every slot instead: its output is never used, and a fully masked row would make NaNs."""
    C = valid.shape[1]
    causal = torch.arange(C, device=valid.device)[None, :] <= slots[:, None]  # [T, C]
    allowed = valid.bool()[:, None, None, :] & causal  # [B, 1, T, C]
    return allowed | ~allowed.any(-1, keepdim=True)


class FullCapacityWriter:
    """The cache as the compiled pass sees it: ``update`` writes a layer's new K/V at ``slots``
    in place and returns the layer's whole buffers [B, H_kv, C, hd]."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots  # [N, B, H_kv, C, hd] x2, [T]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer_idx].index_copy_(2, self.slots, k)
        self.values[layer_idx].index_copy_(2, self.slots, v)
        return self.keys[layer_idx], self.values[layer_idx]


def bucket(tokens: int) -> int:
    """The compiled graph's token count for a pass over ``tokens``: the next power of two."""
    return 1 << (tokens - 1).bit_length()


class CompiledDecoder:
    """Callable like LeanDecoder for the engine's caches; its full passes over the static cache
    of up to ``max_tokens`` new tokens run compiled."""

    takes_static_cache = True
    takes_block_mask = True  # a token tree's pass runs eagerly with its mask

    def __init__(self, decoder: LeanDecoder, mode: str | None = None, max_tokens: int = 32):
        self.decoder, self.mode, self.max_tokens = decoder, mode, max_tokens
        self.config, self.dtype, self.device = decoder.config, decoder.dtype, decoder.device
        self.compiled_passes = 0  # passes that ran compiled (the rest ran eagerly)
        self.windowed = any(w is not None for w in decoder.windows)
        self._compiled = torch.compile(self._pass, mode=mode, fullgraph=True)

    def _pass(self, input_ids: torch.Tensor, position_ids: torch.Tensor, valid: torch.Tensor, start: torch.Tensor,
              keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        d = self.decoder
        slots = start + torch.arange(input_ids.shape[1], device=input_ids.device)  # [Tb]
        hidden = d.run_layers(d.embed(input_ids), range(d.n_layers), FullCapacityWriter(keys, values, slots), None,
                              position_ids, mask=full_capacity_mask(valid, slots))
        return d.logits(hidden)  # [B, Tb, V]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, cache=None, logits_to_keep: int = 1,
                 hidden_layers: tuple[int, ...] = (), mask: torch.Tensor | None = None, **_) -> SimpleNamespace:
        T = input_ids.shape[1]
        lengths = set(cache.layer_length) if isinstance(cache, StaticRaggedKV) else None
        # A token tree's pass (its own mask) and one a draft reads hidden states of run eagerly: the
        # compiled graph builds a causal mask and returns logits alone.
        if (lengths is None or len(lengths) != 1 or T > self.max_tokens or not logits_to_keep or mask is not None
                or hidden_layers or self.windowed):
            return self.decoder(input_ids, attention_mask, position_ids, cache, logits_to_keep, hidden_layers, mask)
        start = lengths.pop()  # every layer holds the same slots; extend booked [start, start + T)
        padding = bucket(T) - T
        if padding:  # written past the cache's end: masked from every query, overwritten by the next pass
            input_ids = torch.cat([input_ids, input_ids[:, -1:].expand(-1, padding)], dim=1)  # [B, Tb]
            position_ids = torch.cat([position_ids, position_ids[:, -1:].expand(-1, padding)], dim=1)
        cache.reserve(start + T + padding)
        logits = self._compiled(input_ids, position_ids, cache.valid, torch.tensor(start, device=input_ids.device),
                                cache.keys, cache.values)  # [B, Tb, V]
        cache.layer_length = [start + T] * self.decoder.n_layers
        self.compiled_passes += 1
        return SimpleNamespace(logits=logits[:, T - logits_to_keep : T])
