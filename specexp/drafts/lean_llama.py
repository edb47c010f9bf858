"""A lean forward pass for small Llama drafts: the model's own modules, without HF's per-call plumbing.

For a 2-layer draft at batch 1, ``LlamaForCausalLM.__call__``'s plumbing (4-D mask construction,
kwargs routing through decorated modules, output records) costs 0.4-0.6 ms of a ~4 ms draft
step, a tenth of c (benchmarks/draft_step_split.md). This pass calls the same modules
(`core/layers.decoder_parts`: the embedding, each layer's norms, projections and MLP, the rotary
embedding, the final norm and head, whatever they are, int8 ones included) and the same cache
(``cache.update``, so RaggedKV's crop and masks work unchanged), and does the attention itself
with one SDPA call per layer.

Only plain Llama configs take it (`supports_lean_forward`); everything else keeps HF's forward.
tests/test_kv.py checks its logits against HF's through ragged rewinds of a left-padded batch.
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import Cache, PreTrainedModel

from specexp.core.layers import decoder_parts, final_logits


def supports_lean_forward(model: PreTrainedModel) -> bool:
    config = model.config
    return (getattr(config, "model_type", None) == "llama" and not getattr(config, "attention_bias", False)
            and set(getattr(config, "layer_types", None) or ["full_attention"]) == {"full_attention"}
            and not model.training)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_mask_4d(attention_mask: torch.Tensor, T: int) -> torch.Tensor:
    """Slot validity [B, S+T] (long) -> which keys each of the T new queries sees [B, 1, T, S+T] (bool).

    Causal within the new tokens. A query that sees nothing (a left-padding position) sees every
    slot instead, as HF does for SDPA: its output is never used, and a fully masked row would make NaNs."""
    L, device = attention_mask.shape[1], attention_mask.device
    causal = torch.arange(L, device=device)[None, :] <= torch.arange(L - T, L, device=device)[:, None]  # [T, L]
    allowed = attention_mask.bool()[:, None, None, :] & causal  # [B, 1, T, L]
    return allowed | ~allowed.any(-1, keepdim=True)


class LeanLlama:
    """Callable like the model for RaggedKV: ``(input_ids, attention_mask, position_ids, cache, ...) -> .logits``."""

    def __init__(self, model: PreTrainedModel):
        self.config = model.config  # RaggedKV sizes its cache from it
        self.parts = decoder_parts(model)

    def attention(self, layer_idx: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mask: torch.Tensor, cache: Cache) -> torch.Tensor:
        attn = self.parts.layers[layer_idx].self_attn
        B, T, _ = x.shape
        q = attn.q_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = attn.k_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)  # [B, H_kv, T, hd]
        v = attn.v_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = cache.update(k, v, layer_idx)  # [B, H_kv, S+T, hd]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling,
                                             enable_gqa=q.shape[1] != k.shape[1])  # [B, H, T, hd]
        return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Cache, logits_to_keep: int = 1, **_) -> SimpleNamespace:
        hidden = self.parts.embed_tokens(input_ids)  # [B, T, H]
        cos, sin = self.parts.rotary_emb(hidden, position_ids=position_ids)  # [B, T, hd]
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        mask = attention_mask_4d(attention_mask, input_ids.shape[1])
        for i, layer in enumerate(self.parts.layers):
            hidden = hidden + self.attention(i, layer.input_layernorm(hidden), cos, sin, mask, cache)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return SimpleNamespace(logits=final_logits(self.parts, hidden[:, -logits_to_keep:]))  # [B, logits_to_keep, V]
