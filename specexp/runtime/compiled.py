"""runtime.compile=true: every model step of a round as a compiled graph, the target's and the draft's.

A `CompiledDecoder` runs a lean decoder's steps over its held static caches as compiled graphs and,
on CUDA, replays them as CUDA graphs (``mode="reduce-overhead"``): a full pass over T new tokens (the
target's verify pass, a small LM's draft step), a token tree's pass (its mask an input), a pass whose
hidden states a feature draft reads (returned beside the logits), and a run of some of its layers
from hidden states to hidden states (an EAGLE head's layer, an early exit's layers). Inside the graph
the new keys and values are written in place at slots [start, start + T) of the static cache
(``start`` a view into the cache's slot numbers on the device, so steps do not recompile and the
host copies nothing), and attention reads every slot of the cache's capacity, the mask hiding
those a query may not see. T is padded up to a bucket (1, 2, 4, 8, ...): the padding tokens are
written past the cache's end, where no mask shows them and the next pass overwrites them, and
their outputs are dropped. So a decoder compiles one graph per bucket, batch size and kind of step.

The cache's buffers are the decoder's own, one per batch size, cleared and handed out again by
every decode (``held_cache``): a CUDA graph replays on the addresses it was recorded with, and
cudagraph trees refuse (run without graphs) a graph that writes into inputs whose addresses may
change. Held at a capacity rounded up to 256 slots and only grown, they keep one shape, so a
study compiles each graph once: ``warm`` does that before anything is timed.

Passes it does not take run eagerly through the same decoder: passes over more than ``max_tokens``
new tokens (long prompts), caches it does not hold (a transformers cache, another decoder's), runs
of layers that hold different numbers of slots, and every pass of a model with sliding-window
layers (Gemma3: its window is over each row's positions, which the full-capacity mask does not
carry).

`StepCompiler` makes one CompiledDecoder per decoder for a run (the target's, the draft's) and
compiles the small functions a draft runs besides (Medusa's heads), counting compiled calls per
model for summary.json.
"""

from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specexp.core.engine import settle
from specexp.core.kv import ForwardTraits, StaticRaggedKV, declares_forward
from specexp.core.verify import greedy_verify
from specexp.runtime.decoder import LeanDecoder, rms_norm

# torch.compile specialises a graph per bucket, batch size and kind of step, all of one code object:
# more than dynamo's default of 8 recompiles (past which it runs the rest eagerly, silently).
RECOMPILE_LIMIT = 256


def full_capacity_mask(valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Slot validity [B, C] and the new tokens' slots [T] -> which slots each new query sees
    [B, 1, T, C]: valid ones at or before its own. A query that sees nothing (left padding) sees
    every slot instead: its output is never used, and a fully masked row would make NaNs."""
    C = valid.shape[1]
    causal = torch.arange(C, device=valid.device)[None, :] <= slots[:, None]  # [T, C]
    allowed = valid.bool()[:, None, None, :] & causal  # [B, 1, T, C]
    return allowed | ~allowed.any(-1, keepdim=True)


def padded_mask(mask: torch.Tensor, tokens: int, capacity: int) -> torch.Tensor:
    """A pass's own mask [B, 1, T, L] over the cache's first L slots -> [B, 1, tokens, capacity]: no
    slot past L seen, and the padding queries past T seeing what the last real one sees."""
    T, L = mask.shape[2:]
    rows = torch.cat([mask, mask[:, :, -1:].expand(-1, -1, tokens - T, -1)], dim=2)  # [B, 1, tokens, L]
    return F.pad(rows, (0, capacity - L))


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


class StepKind(NamedTuple):
    """What a compiled step is, besides its shapes: one graph per kind, bucket and batch size."""

    layers: range  # the layers it runs
    embed: bool  # from token ids (else from hidden states)
    head: bool  # to logits (else to hidden states)
    hidden_layers: tuple[int, ...]  # the hidden states it returns too
    masked: bool  # with a mask of its own (a token tree's), else causal


def full_pass(n_layers: int, hidden_layers: tuple[int, ...] = (), masked: bool = False) -> StepKind:
    """A pass of the whole model from ids to logits (the target's, a small LM's)."""
    return StepKind(range(n_layers), True, True, tuple(hidden_layers), masked)


def pad_tokens(x: torch.Tensor, padding: int) -> torch.Tensor:
    """[B, T, ...] -> [B, T + padding, ...], the last token repeated."""
    return torch.cat([x, x[:, -1:].expand(-1, padding, *x.shape[2:])], dim=1) if padding else x


@declares_forward(ForwardTraits(block_mask=True, cache="held"))
class CompiledDecoder:
    """Callable like LeanDecoder for the engine's caches, with its ``run_layers``, ``embed`` and
    ``logits``; its steps over the static caches it holds, of up to ``max_tokens`` new tokens, run compiled."""

    def __init__(self, decoder: LeanDecoder, mode: str | None = None, max_tokens: int = 32, backend: str = "inductor"):
        self.decoder, self.mode, self.max_tokens = decoder, mode, max_tokens
        self.config, self.dtype, self.device = decoder.config, decoder.dtype, decoder.device
        self.n_layers = decoder.n_layers
        self.compiled_passes = 0  # steps that ran compiled (the rest ran eagerly)
        self.windowed = any(w is not None for w in decoder.windows)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                               4 * RECOMPILE_LIMIT)
        self._compiled = torch.compile(self._step, mode=mode, fullgraph=True, dynamic=False, backend=backend)
        self._held: dict[int, StaticRaggedKV] = {}  # batch size -> the cache every decode of it uses
        self._slot_numbers: torch.Tensor | None = None  # [C]: slot i's number, on the device (``start`` is a view)
        self.kinds: set[StepKind] = set()  # the kinds of step it has run compiled (``warm`` compiles their buckets)

    def held_cache(self, batch_size: int, capacity: int, device: torch.device) -> StaticRaggedKV:
        """The cache for a decode of ``batch_size`` rows booking up to ``capacity`` slots: the one held
        for that batch size, cleared, or a larger one that replaces it. One decode at a time: the
        engine runs its target's decodes one after another, a draft its own."""
        held = self._held.get(batch_size)
        if held is not None and held.capacity >= capacity + self.max_tokens:
            held.clear()
            return held
        held = StaticRaggedKV.for_model(self, batch_size, held_capacity(capacity, self.max_tokens), device)
        for buffer in (held.keys, held.values, held.valid):  # CUDA graphs may write and read them in place
            torch._dynamo.mark_static_address(buffer, guard=False)
        self._held[batch_size] = held
        if self._slot_numbers is None or len(self._slot_numbers) < held.capacity:
            self._slot_numbers = torch.arange(held.capacity, device=device)
        return held

    def holds(self, cache) -> bool:
        return any(cache is held for held in self._held.values())

    @property
    def windows(self) -> list[int | None]:
        return self.decoder.windows

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed(input_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.logits(hidden)

    def check_exit_layer(self, exit_layer: int) -> None:
        self.decoder.check_exit_layer(exit_layer)

    def stats(self) -> dict:
        """Steps that ran compiled, for summary.json."""
        return {"compiled_passes": self.compiled_passes}

    @torch.inference_mode()  # as the engine runs its passes (a graph compiled for autograd would not serve them)
    def warm(self, batch_sizes: Iterable[int], pass_tokens: Iterable[int], capacity: int,
             kinds: Iterable[StepKind] | None = None) -> int:
        """Compile (on CUDA also record) the graph of every bucket that steps over ``pass_tokens`` new
        tokens take, for each batch size and each kind of step (``kinds``; None: every kind this decoder
        has run), on the held caches at ``capacity``: the first call of a graph compiles it, which no
        timed decode should pay. Returns the graphs warmed."""
        if self.windowed:  # its passes all run eagerly
            return 0
        buckets = sorted({bucket(t) for t in pass_tokens if 0 < t <= self.max_tokens})
        kinds = sorted(set(self.kinds if kinds is None else kinds), key=str)
        sizes, hidden_size = sorted(set(batch_sizes)), self.config.get_text_config().hidden_size
        for batch_size, tokens, kind in ((b, t, k) for b in sizes for t in buckets for k in kinds):
            cache = self.held_cache(batch_size, capacity, self.device)
            width = self.decoder.input_width if kind.layers.start == 0 else hidden_size  # EAGLE-3's first layer: 2H
            shape = (batch_size, tokens) if kind.embed else (batch_size, tokens, width)
            inputs = torch.zeros(shape, dtype=torch.long if kind.embed else self.dtype, device=self.device)
            positions = torch.zeros(batch_size, tokens, dtype=torch.long, device=self.device)
            mask = torch.ones(batch_size, 1, tokens, cache.capacity, dtype=torch.bool, device=self.device) \
                if kind.masked else None
            self._compiled(inputs, positions, cache.valid, self._slot_numbers[0], cache.keys, cache.values, mask,
                           kind.layers, kind.embed, kind.head, kind.hidden_layers)
        for batch_size in sizes:
            self.held_cache(batch_size, capacity, self.device)  # left cleared
        return len(sizes) * len(buckets) * len(kinds)

    def _step(self, inputs: torch.Tensor, position_ids: torch.Tensor, valid: torch.Tensor, start: torch.Tensor,
              keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, layers: range, embed: bool,
              head: bool, hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The graph: ``inputs`` (ids [B, Tb] when ``embed``, else hidden states [B, Tb, H]) through
        ``layers``, writing their K/V at slots start.., attending over the capacity as ``mask`` [B, 1,
        Tb, C] says (None: causally over ``valid`` [B, C]); returns the logits (``head``) or the last
        hidden states, and the hidden states ``hidden_layers`` (transformers' numbering)."""
        d = self.decoder
        slots = start + torch.arange(inputs.shape[1], device=inputs.device)  # [Tb]
        allowed = full_capacity_mask(valid, slots) if mask is None else mask
        hidden = d.embed(inputs) if embed else inputs
        taps = dict.fromkeys(j - 1 for j in hidden_layers if 0 < j)
        out = d.run_layers(hidden, layers, FullCapacityWriter(keys, values, slots), None, position_ids, taps,
                           mask=allowed)
        states = tuple(hidden if j == 0 else rms_norm(d.norm, out) if j == d.n_layers else taps[j - 1]
                       for j in hidden_layers)
        return (d.logits(out) if head else out), states

    def _run(self, cache: StaticRaggedKV, inputs: torch.Tensor, position_ids: torch.Tensor,
             attention_mask: torch.Tensor | None, mask: torch.Tensor | None, layers: range, embed: bool, head: bool,
             hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None:
        """A step compiled, or None where it must run eagerly (see the module's docstring)."""
        T = inputs.shape[1]
        starts = {cache.layer_length[i] for i in layers} if self.holds(cache) else set()
        if len(starts) != 1 or T > self.max_tokens or self.windowed:
            return None
        self.kinds.add(StepKind(layers, embed, head, hidden_layers, mask is not None))
        start = starts.pop()  # the new tokens' slots [start, start + T): booked by extend, or a draft's own
        padding = bucket(T) - T
        cache.reserve(start + T + padding)
        if len(self._slot_numbers) < cache.capacity:  # the cache grew
            self._slot_numbers = torch.arange(cache.capacity, device=cache.valid.device)
        if mask is not None:
            mask = padded_mask(mask, T + padding, cache.capacity)
        valid = cache.valid
        if attention_mask is not None and attention_mask.shape[1] != cache.length:  # slots not booked (early exit)
            valid = F.pad(attention_mask, (0, cache.capacity - attention_mask.shape[1]))
        out, states = self._compiled(pad_tokens(inputs, padding), pad_tokens(position_ids, padding), valid,
                                     self._slot_numbers[start], cache.keys, cache.values, mask, layers, embed, head,
                                     hidden_layers)
        for i in layers:
            cache.layer_length[i] = start + T
        self.compiled_passes += 1
        return out[:, :T], tuple(s[:, :T] for s in states)

    def run_layers(self, hidden: torch.Tensor, layers: range, cache, attention_mask: torch.Tensor | None,
                   position_ids: torch.Tensor, taps: dict[int, torch.Tensor] | None = None,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
        """`LeanDecoder.run_layers`, compiled over a held cache (taps run eagerly)."""
        compiled = None if taps is not None else self._run(cache, hidden, position_ids, attention_mask, mask, layers,
                                                           False, False, ())
        if compiled is None:
            return self.decoder.run_layers(hidden, layers, cache, attention_mask, position_ids, taps, mask)
        return compiled[0]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, cache=None, logits_to_keep: int = 1,
                 hidden_layers: tuple[int, ...] = (), mask: torch.Tensor | None = None, **_) -> SimpleNamespace:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(
                input_ids.shape[0], -1)
        hidden_layers = tuple(hidden_layers)
        compiled = self._run(cache, input_ids, position_ids, None, mask, range(self.n_layers), True, True,
                             hidden_layers)
        if compiled is None:
            return self.decoder(input_ids, attention_mask, position_ids, cache, logits_to_keep, hidden_layers, mask)
        logits, states = compiled
        kept = logits[:, -logits_to_keep:] if logits_to_keep else logits
        return SimpleNamespace(logits=kept, hidden_states=dict(zip(hidden_layers, states, strict=True)))


class StepCompiler:
    """runtime.compile=true for a run: one CompiledDecoder per decoder (the target's, and the draft's own
    models', given by role), the small functions a draft runs besides compiled alike, and what ran
    compiled per role for summary.json."""

    def __init__(self, mode: str | None, max_tokens: int, backend: str = "inductor"):
        self.mode, self.max_tokens, self.backend = mode, max_tokens, backend
        self.decoders: dict[int, tuple[str, CompiledDecoder]] = {}  # id(lean decoder) -> (role, its compiled one)
        self.calls: dict[str, list[int]] = {}  # role -> [compiled calls] of its functions
        self.graphs_at_timing: int | None = None  # graphs compiled in this process when timing began
        # a greedy round's verify and commit (engine.settle), fused; without CUDA graphs: it reads the decode's
        # own tensors
        self.settle = self.function(settle, "verify", cuda_graphs=False)

    def decoder(self, decoder: LeanDecoder | CompiledDecoder, role: str) -> CompiledDecoder:
        """The decoder's compiled steps (the same object for the same decoder: a shared early exit runs
        the target's)."""
        if id(decoder) in {id(c) for _, c in self.decoders.values()}:
            return decoder
        if id(decoder) not in self.decoders:
            self.decoders[id(decoder)] = (role, CompiledDecoder(decoder, self.mode, self.max_tokens, self.backend))
        return self.decoders[id(decoder)][1]

    def function(self, fn: Callable, role: str, cuda_graphs: bool = True) -> Callable:
        """``fn`` compiled (a draft's heads over the target's features), its calls counted under ``role``;
        ``cuda_graphs=False``: never replayed as a CUDA graph (inputs at new addresses every decode)."""
        mode = self.mode if cuda_graphs or self.mode != "reduce-overhead" else "default"
        compiled = torch.compile(fn, mode=mode, fullgraph=True, dynamic=False, backend=self.backend)
        calls = self.calls.setdefault(role, [0])

        def counted(*args, **kwargs):
            calls[0] += 1
            return compiled(*args, **kwargs)

        return counted

    def warm(self, batch_sizes: Iterable[int], pass_tokens: Iterable[int], capacity: int) -> int:
        """Every decoder's graphs for every bucket of ``pass_tokens``, of each kind of step it has run."""
        return sum(compiled.warm(batch_sizes, pass_tokens, capacity) for _, compiled in self.decoders.values())

    @torch.inference_mode()
    def warm_settle(self, batch_sizes: Iterable[int], ks: Iterable[int], vocab_size: int, eos: torch.Tensor,
                    tree: bool = False) -> None:
        """Compile the greedy ``settle`` for each batch size and proposal width K (a tree's too), on dummy rounds."""
        device = eos.device
        for B, K in ((b, k) for b in sorted(set(batch_sizes)) for k in sorted(set(ks))):
            for parents in [None] + ([torch.full((B, K), -1, device=device)] if tree and K else []):
                zeros = torch.zeros(B, dtype=torch.long, device=device)
                self.settle(torch.zeros(B, K, dtype=torch.long, device=device), parents,
                            torch.zeros(B, K, vocab_size, device=device),
                            torch.zeros(B, K + 1, dtype=torch.long, device=device),
                            greedy_verify, zeros, zeros.bool(), zeros, eos, torch.tensor(1, device=device))

    def timing_begins(self) -> None:
        """From here on a study times: a graph compiled later is charged to an arm (counted in ``stats``)."""
        from torch._dynamo.utils import counters  # imported here: torch._dynamo is slow to import

        self.graphs_at_timing = counters["stats"]["unique_graphs"]

    def stats(self) -> dict:
        """summary.json's record: compiled calls per role, graphs compiled after timing began (none should
        be), and graphs cudagraph trees declined to run as CUDA graphs (this process's count: under
        reduce-overhead it should stay 0)."""
        from torch._dynamo.utils import counters  # imported here: torch._dynamo is slow to import

        while_timing = (None if self.graphs_at_timing is None
                        else counters["stats"]["unique_graphs"] - self.graphs_at_timing)
        passes: dict[str, int] = {}
        for role, compiled in self.decoders.values():
            passes[role] = passes.get(role, 0) + compiled.compiled_passes
        for role, calls in self.calls.items():
            passes[role] = passes.get(role, 0) + calls[0]
        return {"compiled_passes": passes, "graphs_compiled_while_timing": while_timing,
                "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}
