"""KV caches whose rows hold different numbers of valid tokens.

Rows of a batch accept different numbers of draft tokens, so after a round their tips
differ. Instead of realigning rows, every slot of the cache keeps a validity bit: rejected
entries are masked out of attention and rows take position ids from their own count of
valid tokens. Slots that are invalid in every row are given back at the end, so with B == 1
the cache is always dense. The mask also carries left padding of the prompts.

A pass may also append a token tree (``forward(..., parents=)``: each node sees the committed
prefix, the tip and its own ancestors, at the position of its depth); ``keep_path`` then moves
the accepted path's entries into place after the tip and drops the rest, so the cache holds
committed tokens only, in order.

Two stores with one contract (``forward``, ``forward_features``, ``extend``, ``update``, ``drop_last``, ``keep_path``,
``mask``, ``n_valid``): `StaticRaggedKV` preallocates every layer and rewinds by moving an end index
(the lean runtime's); `RaggedKV` wraps transformers' DynamicCache for transformers' forward
(runtime=hf), whose rewind crops tensors.
"""

from dataclasses import dataclass

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, PreTrainedModel

from specexp.core.masks import attention_mask_4d, masks_by_layer_type, sliding_window
from specexp.core.tree import tree_mask, tree_positions


@dataclass(frozen=True)
class ForwardTraits:
    """What a cache needs to know of the forward it feeds, declared by the forward's class
    (``@declares_forward``); transformers' models declare nothing and are TRANSFORMERS_FORWARD."""

    # a 4-D bool mask as `mask=` and chosen hidden states as `hidden_layers=` (the lean decoder); False:
    # transformers' additive mask and output_hidden_states
    block_mask: bool = False
    # dynamic: transformers' DynamicCache (RaggedKV); static: a preallocated StaticRaggedKV; held: the forward
    # holds its own and hands it out cleared (`held_cache(batch_size, capacity, device)`: CUDA graphs replay
    # on the addresses they were recorded with)
    cache: str = "dynamic"


TRANSFORMERS_FORWARD = ForwardTraits()
_DECLARED: dict[type, ForwardTraits] = {}  # a forward's class -> what it declared


def declares_forward(traits: ForwardTraits):
    """Class decorator: the forward's declaration, read by `forward_traits` (its subclasses inherit it)."""
    def declare(cls: type) -> type:
        _DECLARED[cls] = traits
        return cls
    return declare


def forward_traits(model) -> ForwardTraits:
    """What ``model``'s class (or the nearest of its bases) declared; TRANSFORMERS_FORWARD if none did."""
    return next((_DECLARED[cls] for cls in type(model).__mro__ if cls in _DECLARED), TRANSFORMERS_FORWARD)


def require_cache_keyword(version: str) -> None:
    """transformers' models take the KV cache as ``cache=`` from 5.24 on; an earlier release ignores
    the keyword and runs every pass without the past, so greedy output silently differs from the
    target's. pyproject pins >= 5.24; this stops an older one found installed beside it."""
    if Version(version) < Version("5.24"):
        raise ImportError(f"specexp needs transformers >= 5.24 (found {version}): pip install 'transformers>=5.24,<6'")


require_cache_keyword(transformers.__version__)


def region_mask(slot_valid: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """The 4-D mask [B, 1, T, L] of T queries that see every valid slot before a tree region (the
    last R slots of slot_valid [B, L]) and, within it, the slots ``seen`` [B, T, R] says."""
    T, R = seen.shape[1:]
    before = slot_valid[:, None, : -R].bool().expand(-1, T, -1)  # [B, T, L-R]
    return torch.cat([before, seen], dim=-1)[:, None]


def block_mask(slot_valid: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """The 4-D mask of a tree pass [B, 1, N+1, L]: every valid slot before the block, then the tree
    within it (the block's N+1 slots are the last of slot_valid [B, L])."""
    return region_mask(slot_valid, tree_mask(parents))


def path_sources(path: torch.Tensor, start: int) -> torch.Tensor:
    """Slots to copy into start+1..start+D from [B, D]: the accepted nodes' (slot start+1+node), a
    slot's own where the path has ended (-1)."""
    D = path.shape[1]
    own = start + 1 + torch.arange(D, device=path.device)
    return torch.where(path >= 0, start + 1 + path, own)


def hidden_features(output, hidden_layers: tuple[int, ...]) -> torch.Tensor:
    """A forward's hidden states at ``hidden_layers`` (transformers' numbering), side by side [B, T, F]."""
    return torch.cat([output.hidden_states[j] for j in hidden_layers], dim=-1)


class RaggedPasses:
    """The passes both stores run, over their ``extend``, ``mask``, ``n_valid`` and ``_call``."""

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | None = None,
                logits_to_keep: int = 1, parents: torch.Tensor | None = None) -> torch.Tensor:
        """Append T tokens per row ([B, T]; ``input_mask`` 0 for left padding) and return the logits
        of the last ``logits_to_keep`` [B, n, V]; with ``parents`` [B, T-1] the tokens are a tip and a
        tree of T-1 nodes."""
        return self._pass(model, input_ids, input_mask, logits_to_keep, parents, ()).logits

    def forward_features(self, model, input_ids: torch.Tensor, hidden_layers: tuple[int, ...],
                         input_mask: torch.Tensor | None = None, logits_to_keep: int = 1,
                         parents: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`, and the hidden states at ``hidden_layers`` of all T tokens [B, T, F] (the same pass)."""
        output = self._pass(model, input_ids, input_mask, logits_to_keep, parents, hidden_layers)
        return output.logits, hidden_features(output, hidden_layers)

    def _pass(self, model, input_ids, input_mask, logits_to_keep, parents, hidden_layers):
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        n_valid = self.n_valid
        positions = self.extend(input_mask)
        if parents is None or not parents.shape[1]:  # a tree of no nodes is the tip alone
            return self._call(model, input_ids, positions, None, logits_to_keep, hidden_layers)
        return self._call(model, input_ids, tree_positions(n_valid, parents), block_mask(self.mask, parents),
                          logits_to_keep, hidden_layers)

    def forward_nodes(self, model, input_ids: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor,
                      logits_to_keep: int = 1) -> torch.Tensor:
        """Append T tree nodes per row ([B, T] ids at ``positions``) that see the valid slots before a
        tree region and, within it (the last R slots once they are appended), ``seen`` [B, T, R];
        returns the logits of the last ``logits_to_keep`` [B, n, V]. A draft grows its own token
        tree this way, a level per call."""
        self.extend(torch.ones_like(input_ids))
        return self._call(model, input_ids, positions, region_mask(self.mask, seen), logits_to_keep, ()).logits


@dataclass
class RaggedKV(RaggedPasses):
    cache: DynamicCache
    mask: torch.Tensor  # [B, L] long: 1 = slot holds a valid token of that row
    n_valid: torch.Tensor  # [B] long: valid tokens per row = position id of the next token
    window: int | None = None  # a windowed model's (Gemma3's sliding layers): the pass's masks are built here

    @classmethod
    def empty(cls, model: PreTrainedModel, batch_size: int, device: torch.device) -> "RaggedKV":
        window = sliding_window(model.config)
        return cls(
            # a windowed model's sliding layers would evict by slot count; ragged rows need every slot kept
            cache=DynamicCache() if window else DynamicCache(config=model.config),
            mask=torch.zeros(batch_size, 0, dtype=torch.long, device=device),
            n_valid=torch.zeros(batch_size, dtype=torch.long, device=device),
            window=window,
        )

    def _call(self, model, input_ids, positions, allowed: torch.Tensor | None, logits_to_keep: int,
              hidden_layers: tuple[int, ...]):
        attention_mask, extra = self.mask, {}
        lean = forward_traits(model).block_mask  # the lean decoder: a 4-D bool mask, chosen hidden states
        if self.window and not lean:  # transformers' window counts slots: give it masks over positions
            allowed = allowed if allowed is not None else attention_mask_4d(self.mask, input_ids.shape[1])
            attention_mask = masks_by_layer_type(allowed, self.mask, positions, self.window, model.dtype)
        elif allowed is not None:
            if lean:
                extra["mask"] = allowed
            else:  # transformers takes a 4-D additive mask as it is
                attention_mask = torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device).masked_fill(
                    ~allowed, torch.finfo(model.dtype).min)
        if hidden_layers:
            extra |= {"hidden_layers": hidden_layers} if lean else {"output_hidden_states": True}
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, cache=self.cache,
                     use_cache=True, logits_to_keep=logits_to_keep, **extra)

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

    def drop_last(self, n_drop: torch.Tensor, length: int | None = None) -> None:
        """Invalidate the last ``n_drop[b]`` valid tokens of each row b ([B] long); ``length``: the
        leading slots some row still uses after it, where the caller knows (else read back)."""
        self.mask, length = kept_length(self.mask, n_drop, length)
        self.n_valid = self.n_valid - n_drop
        # Physically drop the tail that no row uses any more.
        trailing = self.mask.shape[1] - length
        if trailing > 0:
            self.cache.crop(-trailing)
            self.mask = self.mask[:, :length]

    def keep_path(self, path: torch.Tensor, n_accepted: torch.Tensor, n_nodes: int, chain: bool = False,
                  kept: int | None = None) -> None:
        """After a pass over the tip and ``n_nodes`` draft tokens (a tree's, or a chain's): the
        accepted nodes' entries ([B, D] node indices, -1 past n_accepted) move to the slots after
        the tip, in order (a ``chain``'s are there already); every other node is dropped. ``kept``:
        the most any row accepted, where the host knows it (else read back)."""
        start = self.mask.shape[1] - n_nodes - 1  # the tip's slot
        path = path[:, :n_nodes]  # a path holds at most n_nodes of them
        if not chain and n_nodes:
            source = path_sources(path, start)  # [B, D]
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    held = getattr(layer, name)  # [B, H, S, hd]
                    index = source[:, None, :, None].expand(-1, held.shape[1], -1, held.shape[3])
                    held[:, :, start + 1 : start + 1 + path.shape[1]] = held.gather(2, index)
        self.drop_last(n_nodes - n_accepted, None if kept is None else start + 1 + kept)


def kept_length(mask: torch.Tensor, n_drop: torch.Tensor, length: int | None = None) -> tuple[torch.Tensor, int]:
    """Invalidate the last ``n_drop[b]`` valid slots of each row of ``mask`` [B, L]; returns the
    new mask and how many leading slots some row still uses: ``length`` where the caller knows it,
    else read back (one host sync)."""
    after = mask.flip(1).cumsum(1).flip(1)  # [B, L]: valid slots at or after each slot
    mask = mask * (after > n_drop[:, None])
    if length is not None:
        return mask, length
    L = mask.shape[1]
    slot_number = torch.arange(1, L + 1, device=mask.device)  # [L]
    return mask, int((mask.any(0) * slot_number).max()) if L else 0


class StaticRaggedKV(RaggedPasses):
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

    def clear(self) -> None:
        """Hold no tokens again, keeping the buffers (and their addresses). Stale keys and values
        stay behind, masked from every query like any invalid slot."""
        self.valid.zero_()
        self.n_valid = torch.zeros_like(self.n_valid)
        self.length = 0
        self.layer_length = [0] * len(self.layer_length)

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

    def _call(self, model, input_ids, positions, allowed: torch.Tensor | None, logits_to_keep: int,
              hidden_layers: tuple[int, ...]):
        extra = {} if allowed is None else {"mask": allowed}  # the lean decoder takes a tree's 4-D mask as is
        return model(input_ids=input_ids, attention_mask=self.mask, position_ids=positions, cache=self,
                     logits_to_keep=logits_to_keep, hidden_layers=hidden_layers, **extra)

    def drop_last(self, n_drop: torch.Tensor, length: int | None = None) -> None:
        """Invalidate the last ``n_drop[b]`` valid tokens of each row b ([B] long); ``length``: the
        leading slots some row still uses after it, where the caller knows (else read back)."""
        mask, length = kept_length(self.mask, n_drop, length)
        self.valid[:, : self.length] = mask
        self.n_valid = self.n_valid - n_drop
        self.length = length
        self.layer_length = [min(n, length) for n in self.layer_length]

    def keep_path(self, path: torch.Tensor, n_accepted: torch.Tensor, n_nodes: int, chain: bool = False,
                  kept: int | None = None) -> None:
        """After a pass over the tip and ``n_nodes`` draft tokens (a tree's, or a chain's): the
        accepted nodes' entries ([B, D] node indices, -1 past n_accepted) move to the slots after
        the tip, in order (one gather and one write for all layers; a ``chain``'s are there already);
        every other node is dropped. ``kept``: the most any row accepted, where the host knows it."""
        start = self.length - n_nodes - 1  # the tip's slot
        path = path[:, :n_nodes]  # a path holds at most n_nodes of them
        if not chain and n_nodes:
            source = path_sources(path, start)  # [B, D]
            N, B, H, _, hd = self.keys.shape
            index = source[None, :, None, :, None].expand(N, B, H, -1, hd)
            moved = slice(start + 1, start + 1 + path.shape[1])
            self.keys[:, :, :, moved] = self.keys.gather(3, index)
            self.values[:, :, :, moved] = self.values.gather(3, index)
        self.drop_last(n_nodes - n_accepted, None if kept is None else start + 1 + kept)


def new_ragged_kv(model, batch_size: int, device: torch.device, capacity: int) -> "RaggedKV | StaticRaggedKV":
    """The cache a forward takes: preallocated for the lean runtime's, a DynamicCache for
    transformers' (whose attention wants a transformers Cache). A forward that holds its own
    (the compiled decoder: CUDA graphs replay on fixed addresses) hands that out, cleared."""
    cache = forward_traits(model).cache
    if cache == "held":
        return model.held_cache(batch_size, capacity, device)
    if cache == "static":
        return StaticRaggedKV.for_model(model, batch_size, capacity, device)
    return RaggedKV.empty(model, batch_size, device)
