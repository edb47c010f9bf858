"""runtime.compile=true: the lean decoder's pass over T new tokens as one compiled graph.

Static shapes make it compilable end to end and, on CUDA, replayable as a CUDA graph
(``mode="reduce-overhead"``): inside the graph the new keys and values are written in place at
slots [start, start + T) of the static cache (``start`` a tensor, so steps do not recompile),
and attention reads every slot of the cache's capacity, the mask hiding those no row holds.
T is padded up to a bucket (1, 2, 4, 8, ...): the padding tokens are written past the cache's
end, where no mask shows them and the next pass overwrites them, and their logits are dropped.
So a run compiles one graph per bucket (and batch size), each with the matmul plan of its rows.

The cache's buffers are the decoder's own, one per batch size, cleared and handed out again by
every decode (``held_cache``): a CUDA graph replays on the addresses it was recorded with, and
cudagraph trees refuse (run without graphs) a graph that writes into inputs whose addresses may
change. Held at a capacity rounded up to 256 slots and only grown, they keep one shape, so a
study compiles each graph once: ``warm`` does that before anything is timed.

Passes it does not take run eagerly through the same decoder: prompts longer than
``max_tokens``, a transformers cache, a shared early-exit draft's split passes (whose layers hold
different numbers of slots), token trees, passes whose hidden states a draft reads, and every pass
of a model with sliding-window layers (Gemma3: its window is over each row's positions, which the
full-capacity mask does not carry).
"""

from collections.abc import Iterable
from types import SimpleNamespace

import torch

from specexp.core.kv import ForwardTraits, StaticRaggedKV, declares_forward
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


CAPACITY_STEP = 256  # held caches' capacities are multiples of this: nearby prompt lengths share one shape


def held_capacity(slots: int, max_tokens: int) -> int:
    """Slots to hold for a decode that books ``slots``: room for a bucket's padding past its end
    (under ``max_tokens``), rounded up to a multiple of CAPACITY_STEP."""
    return -(-(slots + max_tokens) // CAPACITY_STEP) * CAPACITY_STEP


@declares_forward(ForwardTraits(block_mask=True, cache="held"))  # a token tree's pass runs eagerly with its mask
class CompiledDecoder:
    """Callable like LeanDecoder for the engine's caches; its full passes over the static cache
    of up to ``max_tokens`` new tokens run compiled."""

    def __init__(self, decoder: LeanDecoder, mode: str | None = None, max_tokens: int = 32):
        self.decoder, self.mode, self.max_tokens = decoder, mode, max_tokens
        self.config, self.dtype, self.device = decoder.config, decoder.dtype, decoder.device
        self.compiled_passes = 0  # passes that ran compiled (the rest ran eagerly)
        self.windowed = any(w is not None for w in decoder.windows)
        self._compiled = torch.compile(self._pass, mode=mode, fullgraph=True)
        self._held: dict[int, StaticRaggedKV] = {}  # batch size -> the cache every decode of it uses

    def held_cache(self, batch_size: int, capacity: int, device: torch.device) -> StaticRaggedKV:
        """The cache for a decode of ``batch_size`` rows booking up to ``capacity`` slots: the one held
        for that batch size, cleared, or a larger one that replaces it. One decode at a time: the
        engine runs its target's decodes one after another."""
        held = self._held.get(batch_size)
        if held is not None and held.capacity >= capacity + self.max_tokens:
            held.clear()
            return held
        held = StaticRaggedKV.for_model(self, batch_size, held_capacity(capacity, self.max_tokens), device)
        for buffer in (held.keys, held.values, held.valid):  # CUDA graphs may write and read them in place
            torch._dynamo.mark_static_address(buffer, guard=False)
        self._held[batch_size] = held
        return held

    def stats(self) -> dict:
        """For summary.json: passes that ran compiled, and graphs that cudagraph trees declined to
        run as CUDA graphs (this process's count: under reduce-overhead it should stay 0)."""
        from torch._dynamo.utils import counters  # imported here: torch._dynamo is slow to import

        return {"compiled_passes": self.compiled_passes,
                "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}

    @torch.inference_mode()  # as the engine runs its passes (a graph compiled for autograd would not serve them)
    def warm(self, batch_sizes: Iterable[int], pass_tokens: Iterable[int], capacity: int) -> int:
        """Compile (on CUDA also record) the graph of every bucket that passes over ``pass_tokens``
        new tokens take, for each batch size, on the held caches at ``capacity``: the first call of
        a graph compiles it, which no timed decode should pay. Returns the graphs warmed."""
        if self.windowed:  # its passes all run eagerly
            return 0
        buckets = sorted({bucket(t) for t in pass_tokens if 0 < t <= self.max_tokens})
        sizes = sorted(set(batch_sizes))
        for batch_size in sizes:
            for tokens in buckets:
                kv = self.held_cache(batch_size, capacity, self.device)
                ids = torch.zeros(batch_size, tokens, dtype=torch.long, device=self.device)  # [B, Tb]
                kv.forward(self, ids, torch.ones_like(ids))
            self.held_cache(batch_size, capacity, self.device)  # left cleared
        return len(buckets) * len(sizes)

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
