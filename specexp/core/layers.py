"""A decoder-only target's forward pass, split at any layer: embed -> layers [a, b) -> head.

Early-exit drafts run the target's first L layers and verification runs the rest, both over
the very same modules and one shared KV cache whose layers are addressed by their own
``layer_idx``. These helpers call the model's own submodules (embeddings, rotary embedding,
decoder layers, final norm, LM head) exactly as its ``forward`` does, so nothing is copied and
the model's config and layer list are never changed.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import Cache, PreTrainedModel
from transformers.masking_utils import create_causal_mask

from specexp.errors import UserInputError


@dataclass(frozen=True)
class DecoderParts:
    """The submodules of a Llama-style causal LM (Llama, Mistral, Qwen2, SmolLM, ...)."""

    config: object  # the text config
    embed_tokens: nn.Module
    layers: nn.ModuleList
    rotary_emb: nn.Module
    norm: nn.Module
    lm_head: nn.Module

    @property
    def n_layers(self) -> int:
        return len(self.layers)


def decoder_parts(model: PreTrainedModel) -> DecoderParts:
    decoder = model.get_decoder()
    names = ("embed_tokens", "layers", "rotary_emb", "norm")
    missing = [n for n in names if not hasattr(decoder, n)]
    if missing or model.get_output_embeddings() is None:
        raise UserInputError(f"early exit needs a Llama-style decoder ({', '.join(names)}, lm_head); "
                             f"{type(model).__name__} lacks {missing or ['lm_head']}")
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise UserInputError(f"early exit supports full-attention layers only; {type(model).__name__} has {sorted(kinds)}")
    return DecoderParts(config=config, embed_tokens=decoder.embed_tokens, layers=decoder.layers,
                        rotary_emb=decoder.rotary_emb, norm=decoder.norm, lm_head=model.get_output_embeddings())


def check_exit_layer(parts: DecoderParts, exit_layer: int) -> None:
    if not 1 <= exit_layer < parts.n_layers:
        raise UserInputError(f"exit_layer={exit_layer} is not allowed; it must be in 1..{parts.n_layers - 1} "
                             f"for a {parts.n_layers}-layer target")


def run_layers(
    parts: DecoderParts,
    hidden: torch.Tensor,  # [B, T, H]: the input of layer `layers.start`
    layers: range,
    cache: Cache | None,
    attention_mask: torch.Tensor | None,  # [B, S + T] 2-D: every slot of these layers' cache, then the T new ones
    position_ids: torch.Tensor,  # [B, T]
) -> torch.Tensor:
    """Run decoder layers ``layers`` (appending their KV for the T positions); returns [B, T, H]."""
    # Sized against the first layer run: the layers of one call hold the same slots, while
    # layers before and after may hold more or fewer (the shared early-exit cache).
    mask = create_causal_mask(config=parts.config, inputs_embeds=hidden, attention_mask=attention_mask, cache=cache,
                              position_ids=position_ids, layer_idx=layers.start)
    rotary = parts.rotary_emb(hidden, position_ids=position_ids)
    for i in layers:
        hidden = parts.layers[i](hidden, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids,
                                 cache=cache, use_cache=cache is not None)
    return hidden


def final_logits(parts: DecoderParts, hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states [..., H] after the last layer -> the target's logits [..., V]."""
    return parts.lm_head(parts.norm(hidden))
