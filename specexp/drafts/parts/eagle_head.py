"""EAGLE heads: one decoder layer that drafts from the target's own hidden states (Li et al. 2024).

The head's entry for position t reads the pair (g_t, e_{t+1}): g_t the target's features at t
(EAGLE-1: the normed top state; EAGLE-3: a low, a middle and a high layer, fused by a linear
map) and e_{t+1} the embedding of the token that follows. ``fc`` maps the pair to the layer's
input; the layer (Llama's, with its own KV cache at drafting time) attends to the earlier
entries; its output h_{t+1} stands in for the target's next features, and ``norm`` + ``lm_head``
(EAGLE-1: none + the target's own head; with a draft vocabulary or EAGLE-3: an RMSNorm and a head
over N kept tokens + "other") give the next token's distribution. Further draft steps feed h back
as g.

This is specexp's earlier variant of EAGLE-3: the fused features enter through the same ``fc`` over
[e, g] as EAGLE-1, instead of a layer whose attention input is 2H wide; EAGLE-3 as published (what vLLM
serves) is drafts/parts/eagle3_head.py. `EagleSteps` holds what both heads share.

The head quacks like a Llama causal LM (``get_decoder``, ``get_output_embeddings``, ``config``) so
the lean decoder runs its layer; the target's embedding (and head, when shared) are held outside
the module tree (`drafts/parts/feature_head.py`). Saved as ``eagle_head.json`` + ``eagle_head.safetensors``
(+ ``draft_vocab.json``).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specexp.draft_vocab import DraftVocab, restricted_head
from specexp.drafts.parts.feature_head import FeatureHead, Prediction
from specexp.models import LoadedModel
from specexp.runtime.decoder import LeanDecoder, lean_decoder, rms_norm


def eagle3_layers(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high features of an N-layer target (output_hidden_states numbering)."""
    return 2, n_layers // 2, n_layers - 3


class EagleTrunk(nn.Module):
    """The head's decoder, shaped as a Llama decoder: one layer, its rotary embedding, a norm,
    and the target's token embedding (not a submodule)."""

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Module, own_norm: bool):
        super().__init__()
        self._embed = (embed_tokens,)  # a tuple: not registered
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps) if own_norm else nn.Identity()

    @property
    def embed_tokens(self) -> nn.Module:
        return self._embed[0]


class EagleSteps(FeatureHead):
    """What EAGLE heads share, whatever their layer: drafting through the lean decoder and training
    unrolled over their own outputs. A head gives ``inputs(tokens, features, fused)``, its layer's input
    from tokens [B, T] and the state before them (``fused``: the head's own h, fed back), and
    ``logits(h)``."""

    def decoder(self, fuse_projections: bool = True) -> LeanDecoder:
        """The lean forward of the head's layer (unfused for training: the projections' own weights)."""
        return lean_decoder(self, fuse_projections)

    def predictions(self, input_ids: torch.Tensor, features: torch.Tensor) -> list[Prediction]:
        """Per unrolled step j (``unroll_steps``, set by training): entries j-1.. predict the
        teacher's positions j.. (entry t reads features t and token t+1)."""
        steps = self.unrolled(input_ids, features, self.unroll_steps)
        return [Prediction(f"step{j}", logits[:, j - 1 :], j, 1 / len(steps), h[:, j - 1 :])
                for j, (logits, h) in enumerate(steps, start=1)]

    def unrolled(self, tokens: torch.Tensor, features: torch.Tensor,
                 steps: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Training: the head over a whole sequence (tokens [B, T], the target's features [B, T, F]),
        ``steps`` times; step j's entry at t reads step j-1's output at t-1 instead of the target's
        features and attends as drafting step j would (unrolled_mask). Returns per step (logits
        [B, T-1, C], h [B, T-1, H]); entry t predicts token t+2, t < j-1 have no such draft step."""
        decoder = self.decoder(fuse_projections=False)
        B, T = tokens.shape
        positions = torch.arange(T - 1, device=tokens.device)[None].expand(B, -1)
        cache, outputs = StepKV(), []
        g, fused = features[:, :-1], False  # [B, T-1, F]: the features before tokens 1..T-1
        for step in range(1, steps + 1):
            x = self.inputs(tokens[:, 1:], g, fused)
            h = decoder.run_layers(x, range(1), cache, None, positions, mask=unrolled_mask(T - 1, step, tokens.device))
            outputs.append((self.logits(h), h))
            g, fused = F.pad(h[:, :-1], (0, 0, 1, 0)), True  # entry t of the next step reads h at t-1
        return outputs


class EagleHead(EagleSteps):
    """(features [.., F] at t, token at t+1) -> h_{t+1} [.., H] -> logits [.., C] (C = V, or N+1)."""

    kind = "eagle"

    def __init__(self, target: LoadedModel, hidden_layers: tuple[int, ...], draft_vocab: DraftVocab | None = None,
                 own_head: bool = False, intermediate_size: int | None = None):
        super().__init__(target, hidden_layers, draft_vocab)
        text = target.model.config.get_text_config()
        H = self.hidden_size
        self.own_head = own_head or draft_vocab is not None
        output_size = target.vocab_size if draft_vocab is None else draft_vocab.size + 1
        self.config = LlamaConfig(
            vocab_size=output_size, hidden_size=H, intermediate_size=intermediate_size or text.intermediate_size,
            num_hidden_layers=1, num_attention_heads=text.num_attention_heads,
            num_key_value_heads=text.num_key_value_heads,
            head_dim=getattr(text, "head_dim", None) or H // text.num_attention_heads,
            rms_norm_eps=text.rms_norm_eps, max_position_embeddings=text.max_position_embeddings,
            rope_parameters=getattr(text, "rope_parameters", None), hidden_act=text.hidden_act,
            attention_bias=getattr(text, "attention_bias", False), mlp_bias=getattr(text, "mlp_bias", False))
        decoder = target.model.get_decoder()
        self.fuse = nn.Linear(len(self.hidden_layers) * H, H, bias=False) if len(self.hidden_layers) > 1 else None
        self.fc = nn.Linear(2 * H, H)
        self.model = EagleTrunk(self.config, decoder.embed_tokens, own_norm=self.own_head)
        self._target_head = (target.model.get_output_embeddings(),)
        self.lm_head = None
        if self.own_head:  # starts as the target's head, rows cut to the draft vocabulary
            self.lm_head = restricted_head(self._target_head[0].weight, draft_vocab)  # [N+1, H]
            with torch.no_grad():
                self.model.norm.weight.copy_(decoder.norm.weight.detach().float())
        self.to(device=target.model.device, dtype=target.model.dtype)

    def options(self) -> dict:
        return {"own_head": self.own_head, "intermediate_size": self.config.intermediate_size}

    def get_decoder(self) -> EagleTrunk:
        return self.model

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head if self.lm_head is not None else self._target_head[0]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> logits [..., C]: the norm (EAGLE-1 on the target's head: none), then the head
        (in its own dtype: the target's may be bf16 under an fp32 head in training; an int8 head
        takes the layer's)."""
        head = self.get_output_embeddings()
        dtype = head.weight.dtype if head.weight.is_floating_point() else self.dtype
        return head(rms_norm(self.model.norm, hidden).to(dtype))

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """The layer's input [B, T, H] from tokens [B, T] (target ids) and the features before them
        [B, T, F] (``fused``: already H wide, the head's own h)."""
        g = features if fused or self.fuse is None else self.fuse(features.to(self.dtype))
        return self.fc(torch.cat([self.model.embed_tokens(tokens).to(self.dtype), g.to(self.dtype)], dim=-1))

def unrolled_mask(T: int, step: int, device: torch.device) -> torch.Tensor:
    """Which keys entry t of draft step ``step`` sees, over the steps' blocks of T entries each
    [1, 1, T, step*T]: step 1's (target features) up to t - step + 1, then step i's entry at
    t - step + i for i = 2..step (the draft steps before it along one chain, itself last)."""
    t = torch.arange(T, device=device)[:, None]  # [T, 1]
    u = torch.arange(T, device=device)[None, :]  # [1, T]
    blocks = [u <= t - step + 1] + [u == t - step + i for i in range(2, step + 1)]
    return torch.cat(blocks, dim=1)[None, None]


class StepKV:
    """The keys and values of every unrolled step so far (training: a whole sequence per step)."""

    def __init__(self):
        self.keys = self.values = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=2)
        return self.keys, self.values
