"""Which keys each new query of a pass sees, over a ragged cache's slots: causal over the valid
slots, and for a sliding-window layer (Gemma3's) only the last ``window`` positions of its row,
taken over positions (a row's count of valid slots), not slot indices, since ragged rows leave
holes. The lean decoder uses these masks as they are; transformers' forward gets them per layer
type (core/kv.py), because its own window would count slots."""

import torch


def attention_mask_4d(attention_mask: torch.Tensor, T: int) -> torch.Tensor:
    """Slot validity [B, S+T] (long) -> which keys each of the T new queries sees [B, 1, T, S+T] (bool).

    Causal within the new tokens. A query that sees nothing (a left-padding position) sees every
    slot instead, as transformers does for SDPA: its output is never used, and a fully masked row
    would make NaNs."""
    L, device = attention_mask.shape[1], attention_mask.device
    causal = torch.arange(L, device=device)[None, :] <= torch.arange(L - T, L, device=device)[:, None]  # [T, L]
    allowed = attention_mask.bool()[:, None, None, :] & causal  # [B, 1, T, L]
    return allowed | ~allowed.any(-1, keepdim=True)


def key_positions(attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Each slot's position [B, S+T]: a held slot's is its row's count of valid slots before it (as the
    cache gave it), a new slot's the position it is passed at (a tree node's: its depth)."""
    T = position_ids.shape[1]
    held = attention_mask[:, :-T].cumsum(1) - 1  # [B, S]
    return torch.cat([held, position_ids], dim=1)


def windowed(mask: torch.Tensor, keys: torch.Tensor, queries: torch.Tensor, window: int) -> torch.Tensor:
    """A sliding-window layer's mask: ``mask`` [B, 1, T, L] where a query at position i also sees only
    keys at positions > i - window (keys [B, L], queries [B, T]); a query left with nothing (padding)
    sees every slot, as in attention_mask_4d."""
    near = keys[:, None, None, :] > queries[:, None, :, None] - window  # [B, 1, T, L]
    allowed = mask & near
    return allowed | ~allowed.any(-1, keepdim=True)


def sliding_window(config) -> int | None:
    """The window of a model whose layers include sliding-window ones (Gemma3's), else None."""
    config = config.get_text_config()
    kinds = getattr(config, "layer_types", None) or ()
    return getattr(config, "sliding_window", None) if "sliding_attention" in kinds else None


def masks_by_layer_type(allowed: torch.Tensor, slot_valid: torch.Tensor, positions: torch.Tensor, window: int,
                        dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """transformers' per-layer-type masks (additive [B, 1, T, L]) of a pass of a windowed model: the
    full layers' ``allowed``, the sliding layers' the same within ``window`` positions."""
    def additive(mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

    near = windowed(allowed, key_positions(slot_valid, positions), positions, window)
    return {"full_attention": additive(allowed), "sliding_attention": additive(near)}
