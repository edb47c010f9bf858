"""One lean decoder forward for the target and every model draft: the model's own weights and
modules, without transformers' per-call plumbing.

A step of SmolLM2-135M through ``LlamaForCausalLM.__call__`` spends a large share of its time
outside the products (4-D mask construction, kwargs routing through decorated modules, output
records), beside the time its weights take to read (docs/lab_notes/code_measurements.md: the lean
decoder's floor). This forward calls the model's own embedding, norms, rotary embedding, output
projections, MLP activation and LM head, and does the rest itself: one GEMM for q/k/v and one for
gate/up (`fuse_projections`: the original weights become views of the fused ones, so a model holds
each weight once and transformers' forward still works on it; a kept load's fused weights serve
every later load of it), one SDPA call per layer, and the cache's ``update`` (a
`core.kv.StaticRaggedKV` or a transformers Cache).

It is split at any layer (early exit runs layers [0, L) as a draft and [L, N) to verify, over
one shared cache) and taps chosen layers' hidden states (drafts that read the target's
features). Llama-shaped decoders take it (Llama, SmolLM2, Mistral without a sliding window,
Qwen2, Qwen3) and Gemma3's text decoder (its scaled embedding and (1 + w) norms are its own
modules; here: the q/k norms, the norms around attention and MLP, a rotation per layer type, and
the sliding-window layers' mask, taken over each row's positions so ragged caches stay exact);
`runtime=hf` keeps transformers' forward for any other and is the reference tests/runtime/test_decoder.py
checks it against.
"""

import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from specexp.core.kv import ForwardTraits, declares_forward
from specexp.core.masks import attention_mask_4d, key_positions, windowed
from specexp.errors import UserInputError
from specexp.models import spread_over_devices
from specexp.models.reuse import derived_from_kept
from specexp.runtime.int8 import Int8WeightLinear

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
LAYER_TYPES = {"full_attention", "sliding_attention"}  # sliding: Gemma3's (each attention module names its window)
PLAIN_RMS_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the lean forward cannot run this model, or None when it can."""
    if not hasattr(model, "get_decoder"):
        return f"{type(model).__name__} is not a transformers causal LM"
    config = model.config.get_text_config()
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type '{kind}' is not one of {', '.join(ARCHITECTURES)}"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not layer_types <= LAYER_TYPES or (kind != "gemma3_text" and layer_types != {"full_attention"}):
        return f"it has {sorted(layer_types)} layers; only full attention (and Gemma3's sliding window) is supported"
    if kind == "mistral" and getattr(config, "sliding_window", None):
        return f"it uses a sliding window of {config.sliding_window}"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return f"it caps attention logits (attn_logit_softcapping={config.attn_logit_softcapping}), which SDPA cannot"
    decoder = model.get_decoder()
    if not all(hasattr(decoder, n) for n in ("embed_tokens", "layers", "rotary_emb", "norm")):
        return f"{type(model).__name__} has no Llama-style decoder (embed_tokens, layers, rotary_emb, norm)"
    if model.get_output_embeddings() is None:
        return f"{type(model).__name__} has no LM head"
    if spread_over_devices(model):
        return "it is spread over devices by target.device_map (accelerate's hooks move each module's inputs)"
    return None


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [..., hd] with its first half negated, so that rotate_half(x) * sin == x.roll(hd/2) * signed_sin."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of x [B, T, heads, hd] (transformers' half-split layout), in 4 ops.
    Bit-identical to x * cos + rotate_half(x) * sin: negating a factor is exact."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``: one fused kernel for a plain RMSNorm (Llama's, Qwen's, Mistral's: equal to
    theirs bit for bit in fp32), the module itself for anything else."""
    if type(norm).__name__ in PLAIN_RMS_NORMS and x.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


@torch.no_grad()
def fuse_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear computing ``cat([l(x) for l in linears], -1)``. Each original's weight (and bias)
    becomes a view of the fused one: the same memory, so both forwards read the same numbers. The
    fused weights of a kept load's projections are made once for all of a sweep's jobs."""
    weights = [lin.weight for lin in linears]
    weight = derived_from_kept("fused", weights, lambda: torch.cat(weights))  # [sum(out), in]
    has_bias = linears[0].bias is not None
    # On the meta device, because a random initialisation of the fused weight, only to replace it, slows every
    # model load (docs/lab_notes/code_measurements.md: fused weights on the meta device).
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if has_bias:
        biases = [lin.bias for lin in linears]
        fused.bias = nn.Parameter(derived_from_kept("fused", biases, lambda: torch.cat(biases)), requires_grad=False)
    start = 0
    for lin in linears:
        stop = start + lin.out_features
        lin.weight = nn.Parameter(fused.weight[start:stop], requires_grad=lin.weight.requires_grad)
        if has_bias:
            lin.bias = nn.Parameter(fused.bias[start:stop], requires_grad=lin.bias.requires_grad)
        start = stop
    return fused


@dataclass
class LayerWeights:
    """What the lean forward calls for one decoder layer. ``qkv``/``gate_up`` are fused when the
    projections are all plain nn.Linear or all int8 layers."""

    layer: nn.Module
    qkv: nn.Module | None = None  # x -> [q | k | v]
    gate_up: nn.Module | None = None  # x -> [gate | up]


def fused_module(modules: list[nn.Module]) -> nn.Module | None:
    """The modules as one (fp32/bf16 nn.Linear, or int8 layers), or None when they are of other kinds."""
    if all(type(m) is nn.Linear for m in modules):
        return fuse_linears(modules)
    if all(type(m) is Int8WeightLinear for m in modules):
        return Int8WeightLinear.concatenated(modules)
    return None


# core.kv.new_ragged_kv gives it a preallocated cache; a token tree's pass hands it its 4-D mask (`mask`)
@declares_forward(ForwardTraits(block_mask=True, cache="static"))
class LeanDecoder:
    """Callable like a causal LM for the engine's caches:
    ``(input_ids, attention_mask, position_ids, cache, logits_to_keep) -> .logits``; also
    ``embed`` -> ``run_layers`` (any range) -> ``logits`` for split forwards, and hidden states."""

    def __init__(self, model: PreTrainedModel, fuse_projections: bool = True):
        reason = unsupported_reason(model)
        if reason is not None:
            raise UserInputError(f"the lean decoder forward cannot run {type(model).__name__}: {reason}")
        self.config = model.config  # caches size themselves from it
        decoder = model.get_decoder()
        self.embed_tokens, self.rotary_emb, self.norm = decoder.embed_tokens, decoder.rotary_emb, decoder.norm
        self.lm_head = model.get_output_embeddings()
        self.layers = [LayerWeights(layer) for layer in decoder.layers]
        text_config = model.config.get_text_config()
        self.layer_types = list(getattr(text_config, "layer_types", None) or ["full_attention"] * len(self.layers))
        # a layer's window (Gemma3's sliding layers), None for full attention
        self.windows = [getattr(w.layer.self_attn, "sliding_window", None) for w in self.layers]
        self.rotation_per_type = hasattr(self.rotary_emb, "layer_types")  # Gemma3: a rope base per layer type
        self.logit_cap = getattr(text_config, "final_logit_softcapping", None)
        self.fused = False
        if fuse_projections:
            self.fuse()

    def fuse(self) -> None:
        for w in self.layers:
            attn, mlp = w.layer.self_attn, w.layer.mlp
            if w.qkv is None:
                w.qkv = fused_module([attn.q_proj, attn.k_proj, attn.v_proj])
            if w.gate_up is None:
                w.gate_up = fused_module([mlp.gate_proj, mlp.up_proj])
        self.fused = any(w.qkv is not None or w.gate_up is not None for w in self.layers)

    def unfuse(self) -> None:
        """Back to separate products (the projections keep their weights: views of the fused ones)."""
        for w in self.layers:
            w.qkv = w.gate_up = None
        self.fused = False

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' (and the KV cache's) dtype: the embedding's; int8 layers keep weights of their own."""
        return self.embed_tokens.weight.dtype

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def linears(self) -> list[nn.Module]:
        """The Linears this forward calls (fused ones instead of the projections they replace)."""
        found = [self.lm_head]
        for w in self.layers:
            attn, mlp = w.layer.self_attn, w.layer.mlp
            found += [w.qkv] if w.qkv is not None else [attn.q_proj, attn.k_proj, attn.v_proj]
            found += [attn.o_proj]
            found += [w.gate_up] if w.gate_up is not None else [mlp.gate_proj, mlp.up_proj]
            found += [mlp.down_proj]
        return [m for m in found if isinstance(m, nn.Linear)]

    def check_exit_layer(self, exit_layer: int) -> None:
        if not 1 <= exit_layer < self.n_layers:
            raise UserInputError(f"exit_layer={exit_layer} is not allowed; it must be in 1..{self.n_layers - 1} "
                                 f"for a {self.n_layers}-layer target")

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)  # [B, T, H]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [..., H] after the last layer -> logits [..., V]."""
        logits = self.lm_head(rms_norm(self.norm, hidden))
        if self.logit_cap is not None:  # Gemma's soft cap: cap * tanh(logits / cap)
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits

    def _rotations(self, hidden: torch.Tensor, position_ids: torch.Tensor, layers: range) -> dict:
        """cos and signed sin [B, T, 1, hd] (broadcast over heads) for each layer type in ``layers``."""
        rotations = {}
        for kind in {self.layer_types[i] for i in layers}:
            cos, sin = (self.rotary_emb(hidden, position_ids, kind) if self.rotation_per_type
                        else self.rotary_emb(hidden, position_ids=position_ids))  # [B, T, hd]
            rotations[kind] = cos[:, :, None], signed_sin(sin)[:, :, None]
        return rotations

    @property
    def input_width(self) -> int:
        """Features per token of the first layer's input: the hidden size, twice it for EAGLE-3's layer."""
        hidden_size = self.config.get_text_config().hidden_size
        return 2 * hidden_size if hasattr(self.layers[0].layer, "hidden_norm") else hidden_size

    def _block(self, i: int, hidden: torch.Tensor, rotation: tuple, mask: torch.Tensor, cache) -> torch.Tensor:
        """One decoder layer: pre-norm residual blocks (Llama), Gemma's with a norm after each block too, or
        EAGLE-3's, whose input [B, T, 2H] is a token's embedding and a hidden state side by side."""
        layer = self.layers[i].layer
        if hasattr(layer, "hidden_norm"):  # drafts/parts/eagle3_head.Eagle3DecoderLayer
            embedded, state = hidden.chunk(2, dim=-1)
            normed = rms_norm(layer.hidden_norm, state)
            attn_in = torch.cat([rms_norm(layer.input_layernorm, embedded), normed], dim=-1)  # [B, T, 2H]
            hidden = (normed if layer.norm_before_residual else state) + self._attention(i, attn_in, *rotation, mask,
                                                                                          cache)
            return hidden + self._mlp(self.layers[i], rms_norm(layer.post_attention_layernorm, hidden))
        attended = self._attention(i, rms_norm(layer.input_layernorm, hidden), *rotation, mask, cache)
        if not hasattr(layer, "pre_feedforward_layernorm"):
            hidden = hidden + attended
            return hidden + self._mlp(self.layers[i], rms_norm(layer.post_attention_layernorm, hidden))
        hidden = hidden + rms_norm(layer.post_attention_layernorm, attended)
        fed = self._mlp(self.layers[i], rms_norm(layer.pre_feedforward_layernorm, hidden))
        return hidden + rms_norm(layer.post_feedforward_layernorm, fed)

    def _mlp(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        mlp = w.layer.mlp
        if w.gate_up is None:
            gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        else:
            gate, up = w.gate_up(x).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, mask: torch.Tensor,
                   cache) -> torch.Tensor:
        w = self.layers[i]
        attn = w.layer.self_attn
        B, T, _ = x.shape
        if w.qkv is not None:
            qkv = w.qkv(x)
        else:
            qkv = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
        qkv = qkv.view(B, T, -1, attn.head_dim)  # [B, T, H + 2 H_kv, hd]
        H = attn.q_proj.out_features // attn.head_dim
        H_kv = (qkv.shape[2] - H) // 2
        qk = qkv[:, :, : H + H_kv]  # q and k side by side: one rotation for both
        if hasattr(attn, "q_norm"):  # Qwen3, Gemma3: per-head RMSNorm before the rotation
            qk = torch.cat([attn.q_norm(qk[:, :, :H]), attn.k_norm(qk[:, :, H:])], dim=2)
        qk = rotate(qk, cos, sin_signed)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)  # [B, H, T, hd], [B, H_kv, T, hd]
        v = qkv[:, :, H + H_kv :].transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, i)  # [B, H_kv, S+T, hd]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling,
                                             enable_gqa=H != H_kv)  # [B, H, T, hd]
        return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def run_layers(
        self,
        hidden: torch.Tensor,  # [B, T, H]: the input of layer `layers.start`
        layers: range,
        cache,  # StaticRaggedKV, a transformers Cache, or None (no cache: T tokens see each other only)
        attention_mask: torch.Tensor | None,  # [B, S+T]: the slots these layers will hold after the call
        position_ids: torch.Tensor,  # [B, T]
        taps: dict[int, torch.Tensor] | None = None,  # filled with the output of layer i for i in its keys
        mask: torch.Tensor | None = None,  # [B, 1, T, S+T] bool, instead of one built from attention_mask
    ) -> torch.Tensor:
        """Run decoder layers ``layers``, appending their K/V for the T positions; returns [B, T, H]."""
        B, T, _ = hidden.shape
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.long, device=hidden.device)
        if mask is None:
            mask = attention_mask_4d(attention_mask, T)
        masks = {None: mask}  # by window
        for window in {self.windows[i] for i in layers} - {None}:
            masks[window] = windowed(mask, key_positions(attention_mask, position_ids), position_ids, window)
        rotations = self._rotations(hidden, position_ids, layers)
        for i in layers:
            hidden = self._block(i, hidden, rotations[self.layer_types[i]], masks[self.windows[i]], cache)
            if taps is not None and i in taps:
                taps[i] = hidden
        return hidden

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, cache=None, logits_to_keep: int = 1,
                 hidden_layers: tuple[int, ...] = (), mask: torch.Tensor | None = None, **_) -> SimpleNamespace:
        """Logits of the last ``logits_to_keep`` positions [B, n, V] (all with 0), and the hidden
        states ``hidden_layers`` [B, T, H] of every position as ``.hidden_states[j]``, numbered as
        transformers' output_hidden_states: 0 the embeddings, j the output of layer j, N (the last)
        after the final norm. ``mask`` [B, 1, T, S+T] (a token tree's) replaces the causal one
        built from attention_mask."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None].expand(B, T)
        embedded = self.embed(input_ids)
        taps = dict.fromkeys(j - 1 for j in hidden_layers if 0 < j)  # layer j's output is tap j - 1
        hidden = self.run_layers(embedded, range(self.n_layers), cache, attention_mask, position_ids, taps, mask)
        states = {j: embedded if j == 0 else taps[j - 1] for j in hidden_layers}
        if self.n_layers in states:
            states[self.n_layers] = rms_norm(self.norm, hidden)
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return SimpleNamespace(logits=self.logits(kept), hidden_states=states)


# One decoder per model, dropped with it (a decoder holds the model's submodules, never the model).
_DECODERS: "weakref.WeakKeyDictionary[nn.Module, LeanDecoder]" = weakref.WeakKeyDictionary()


def lean_decoder(model: PreTrainedModel, fuse_projections: bool = True) -> LeanDecoder:
    """The model's one lean forward: the target's runtime, a shared early-exit draft and an exit
    head all get the same object (the projections are fused once)."""
    decoder = _DECODERS.get(model)
    if decoder is None:
        decoder = _DECODERS[model] = LeanDecoder(model, fuse_projections)
    elif fuse_projections and not decoder.fused:
        decoder.fuse()  # no-op where nothing is fusable
    return decoder


def existing_decoder(model: nn.Module) -> LeanDecoder | None:
    """The model's lean decoder if something built one, else None."""
    return _DECODERS.get(model)
