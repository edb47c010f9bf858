"""EAGLE-3 as published (Li et al. 2025): the draft head vLLM serves, and speculators and SpecForge train.

The target's hidden states entering three of its layers (``eagle_aux_hidden_state_layer_ids``; by
default the low, middle and high ones, hidden_states 2, N/2 and N-3) are fused by ``fc``
(3H_t -> H, no bias; after one RMSNorm over the 3H_t with ``norm_before_fc``, or one per layer with
``fc_norm``). Its one decoder layer reads the next token's embedding and that state side by side,
each normed (``input_layernorm``, ``hidden_norm``), through q/k/v projections 2H wide; the state is
the residual (normed with ``norm_before_residual``). ``norm`` and ``lm_head`` predict over a draft
vocabulary of N target ids (``d2t``: target id = draft id + d2t; ``t2d``: which target ids are kept),
mapped back to the target's vocabulary with -inf elsewhere. A later draft step feeds the layer's
output back as the state (normed first with ``norm_output``).

The head quacks like a Llama causal LM (``get_decoder`` is itself: ``embed_tokens``, ``layers``,
``rotary_emb``, ``norm``) so the lean decoder runs its layer (runtime/decoder.py takes the layer's two
inputs as one [B, T, 2H] input). Its module and buffer names are speculators', so its state_dict is the
speculators checkpoint; it saves and loads that format (drafts/parts/eagle3_format.py) and loads the
EAGLE authors' / SpecForge layout.
"""

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specexp.draft_vocab import DraftVocab, restrict_rows, vocab_fingerprint
from specexp.drafts.parts.eagle3_format import Eagle3Folder, read_folder, write_speculators
from specexp.drafts.parts.eagle_head import EagleSteps, eagle3_layers
from specexp.drafts.parts.feature_head import target_identity
from specexp.errors import DraftDoesNotApply, UserInputError
from specexp.models import LoadedModel
from specexp.runtime.decoder import rms_norm


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """Llama's decoder layer whose attention reads an embedding and a hidden state side by side: q/k/v
    take 2H, ``hidden_norm`` norms the state (``input_layernorm`` the embedding)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__(config, layer_idx=0)
        attn, H = self.self_attn, config.hidden_size
        for name, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads),
                            ("v_proj", config.num_key_value_heads)):
            setattr(attn, name, nn.Linear(2 * H, heads * attn.head_dim, bias=config.attention_bias))
        self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual


def layer_config(target: LoadedModel, intermediate_size: int | None = None) -> LlamaConfig:
    """The head's decoder layer shaped as one of the target's (its width, heads, norms and rotation)."""
    text = target.model.config.get_text_config()
    return LlamaConfig(
        vocab_size=text.vocab_size, hidden_size=text.hidden_size,
        intermediate_size=intermediate_size or text.intermediate_size,
        num_hidden_layers=1, num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        rms_norm_eps=text.rms_norm_eps, max_position_embeddings=text.max_position_embeddings,
        rope_parameters=getattr(text, "rope_parameters", None), hidden_act=text.hidden_act, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=False)


class Eagle3Head(EagleSteps):
    """(the target's states [.., 3H_t] at t, the token at t+1) -> h_{t+1} [.., H] -> logits [.., N]."""

    kind = "eagle3"
    student = "eagle3"
    other_slot = False  # N outputs, the kept ids only: trained towards the target renormalised over them

    def __init__(self, target: LoadedModel, hidden_layers: tuple[int, ...] | None = None,
                 draft_vocab: DraftVocab | None = None, config: LlamaConfig | None = None,
                 norm_before_residual: bool = False, norm_before_fc: bool = False, fc_norm: bool = False,
                 norm_output: bool = False, own_embedding: bool = False, verifier: dict | None = None):
        n_layers = target.model.config.get_text_config().num_hidden_layers
        hidden_layers = tuple(hidden_layers) if hidden_layers is not None else eagle3_layers(n_layers)
        draft_vocab = draft_vocab or DraftVocab(list(range(target.vocab_size)), target.vocab_size,
                                                vocab_fingerprint(target))
        super().__init__(target, hidden_layers, draft_vocab)
        if norm_before_fc and fc_norm:
            raise UserInputError("norm_before_fc and fc_norm are exclusive: one RMSNorm over the fused states, or one "
                                 "per layer")
        self.config = config or layer_config(target)
        H, H_t, n_aux = self.config.hidden_size, self.hidden_size, len(hidden_layers)
        self.flags = {"norm_before_residual": norm_before_residual, "norm_before_fc": norm_before_fc,
                      "fc_norm": fc_norm, "norm_output": norm_output}
        if norm_before_fc:
            self.input_norm = LlamaRMSNorm(n_aux * H_t, eps=self.config.rms_norm_eps)
        if fc_norm:
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(H_t, eps=self.config.rms_norm_eps) for _ in range(n_aux))
        self.fc = nn.Linear(n_aux * H_t, H, bias=False)
        self.layers = nn.ModuleList([Eagle3DecoderLayer(self.config, norm_before_residual)])
        self.rotary_emb = LlamaRotaryEmbedding(self.config)
        self.norm = LlamaRMSNorm(H, eps=self.config.rms_norm_eps)
        self.lm_head = nn.Linear(H, draft_vocab.size, bias=False)
        d2t, t2d = draft_vocab.offsets()
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        target_embedding = target.model.get_input_embeddings()
        if own_embedding:
            self.embed_tokens = nn.Embedding(self.config.vocab_size, H)
        self._target_embed = (target_embedding,)  # a tuple: not registered
        self.verifier = verifier or {"name_or_path": target.name,
                                     "architectures": list(getattr(target.model.config, "architectures", None) or [])}
        self.speculative_tokens = 3  # the proposal length a server runs it at (speculators' speculative_tokens)
        with torch.no_grad():  # starts as the target's own head and norm, rows cut to the draft vocabulary
            self.lm_head.weight.copy_(restrict_rows(target.model.get_output_embeddings().weight,
                                                    draft_vocab)[: draft_vocab.size])
            self.norm.weight.copy_(target.model.get_decoder().norm.weight.detach().float())
        self.to(device=target.model.device, dtype=target.model.dtype)

    @property
    def embed_tokens(self) -> nn.Module:
        """Its own embedding where its checkpoint holds one, else the target's."""
        own = self._modules.get("embed_tokens")
        return own if own is not None else self._target_embed[0]

    def get_decoder(self) -> "Eagle3Head":
        return self

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the norms' (draft.quantize=int8 swaps every linear, fc too, for int8 ones)."""
        return self.norm.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's states at the head's layers [..., n H_t] -> the layer's state [..., H]."""
        x = features.to(self.dtype)
        if self.flags["norm_before_fc"]:
            x = rms_norm(self.input_norm, x)
        elif self.flags["fc_norm"]:
            x = torch.cat([rms_norm(norm, chunk) for norm, chunk in zip(self.fc_norm, x.chunk(len(self.fc_norm), -1),
                                                                        strict=True)], dim=-1)
        return self.fc(x)

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """The layer's input [B, T, 2H]: the embedding of tokens [B, T] (target ids) beside the state before
        them: the target's fused [B, T, n H_t], or (``fused``) the head's own output h [B, T, H], fed back."""
        state = self.feedback(features) if fused else self.fuse(features)
        return torch.cat([self.embed_tokens(tokens).to(self.dtype), state.to(self.dtype)], dim=-1)

    def feedback(self, h: torch.Tensor) -> torch.Tensor:
        """The layer's output as the next step's state: normed with ``norm_output``."""
        return rms_norm(self.norm, h) if self.flags["norm_output"] else h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> logits over the draft vocabulary [..., N] (int8 layers take the layer's dtype)."""
        head = self.lm_head
        dtype = head.weight.dtype if head.weight.is_floating_point() else self.dtype
        return head(rms_norm(self.norm, hidden).to(dtype))

    def published(self) -> Eagle3Folder:
        """The head as a speculators folder describes it (no weights)."""
        n_layers = self.target_layers
        default = self.hidden_layers == eagle3_layers(n_layers)
        return Eagle3Folder(layer_config=self.config.to_dict(), draft_vocab_size=self.draft_vocab.size,
                            aux_layers=None if default else self.hidden_layers,
                            target_hidden_size=(None if self.hidden_size == self.config.hidden_size
                                                else self.hidden_size),
                            flags=dict(self.flags), verifier=self.verifier, speculative_tokens=self.speculative_tokens)

    def save(self, folder: str | Path, embedding: bool = True) -> None:
        """The speculators format (drafts/parts/eagle3_format.py), which vLLM serves; a head over the whole
        vocabulary writes no d2t / t2d (speculators holds none then). ``embedding``: with the token embedding
        it reads (the target's), as speculators writes it: its from_pretrained leaves a missing one at zero
        (vLLM shares the target's); a head shipped inside specexp leaves it out (the target gives it)."""
        whole = self.draft_vocab.size == self.t2d.numel()
        weights = {k: v.detach().cpu() for k, v in self.state_dict().items() if not (whole and k in ("d2t", "t2d"))}
        if embedding:
            weights["embed_tokens.weight"] = self.embed_tokens.weight.detach().to("cpu", self.dtype)
        write_speculators(folder, self.published(), weights)

    def save_pretrained(self, folder: str | Path) -> None:  # what `specexp.distill` calls to export a student
        self.save(folder)

    @classmethod
    def load(cls, folder: str | Path, target: LoadedModel) -> "Eagle3Head":
        """A speculators-format or EAGLE / SpecForge head, checked against the target it will read."""
        folder = Path(folder).expanduser()
        found = read_folder(folder)
        check_against(found, folder, target)
        config = LlamaConfig(**{k: v for k, v in found.layer_config.items()
                                if k not in ("architectures", "model_type")})
        config.num_hidden_layers, config.tie_word_embeddings = 1, False
        n_layers = target.model.config.get_text_config().num_hidden_layers
        layers = found.aux_layers or eagle3_layers(n_layers)
        d2t = found.weights.get("d2t")
        vocab = DraftVocab.from_offsets(d2t, target.vocab_size, vocab_fingerprint(target)) if d2t is not None else None
        embedding = found.weights.get("embed_tokens.weight")
        shared = target.model.get_input_embeddings().weight
        # the target's embedding as stored (a bf16 export of a head that shares it) is the target's: shared
        own = embedding is not None and not (embedding.shape == shared.shape
                                             and torch.equal(embedding, shared.to(embedding.dtype)))
        head = cls(target, layers, vocab, config, **found.flags, own_embedding=own, verifier=found.verifier)
        expected = set(head.state_dict())
        weights = {k: v for k, v in found.weights.items() if k in expected}  # t2d / d2t of a full vocabulary aside
        if missing := sorted(expected - set(weights) - {"d2t", "t2d"}):
            raise UserInputError(f"EAGLE-3 head '{folder}' lacks weights {missing}")
        head.load_state_dict({k: v.to(head.d2t.dtype if k == "d2t" else head.t2d.dtype if k == "t2d" else head.dtype)
                              for k, v in weights.items()}, strict=False)
        head.speculative_tokens = found.speculative_tokens or head.speculative_tokens
        return head.eval()


def same_model(a: str, b: str) -> bool:
    """Whether two names or paths name the same model: their last parts, case aside (a hub name and the
    embedded default's name agree: HuggingFaceTB/SmolLM2-135M-Instruct and SmolLM2-135M-Instruct)."""
    return Path(a.rstrip("/")).name.lower() == Path(b.rstrip("/")).name.lower()


def check_against(found: Eagle3Folder, folder: Path, target: LoadedModel) -> None:
    """A head trained for another target is refused in one line naming both."""
    identity = target_identity(target)
    H_t = found.target_hidden_size or found.layer_config["hidden_size"]
    if H_t != identity["hidden_size"]:
        raise DraftDoesNotApply(f"EAGLE-3 head '{folder}' reads hidden states of width {H_t}; target '{target.name}' "
                                f"has {identity['hidden_size']}")
    n_layers = identity["target_layers"]
    if found.aux_layers is not None and any(not 0 <= j <= n_layers for j in found.aux_layers):
        raise DraftDoesNotApply(f"EAGLE-3 head '{folder}' reads the target's hidden states {list(found.aux_layers)}; "
                                f"target '{target.name}' has {n_layers} layers (0..{n_layers})")
    vocab = found.layer_config.get("vocab_size")
    t2d = found.weights.get("t2d")
    sizes = {vocab, None if t2d is None else len(t2d)} - {None}
    if sizes and sizes != {target.vocab_size}:
        raise DraftDoesNotApply(f"vocab mismatch: EAGLE-3 head '{folder}' predicts over a vocabulary of "
                                f"{sorted(sizes)} tokens; target '{target.name}' has {target.vocab_size}")
    name = (found.verifier or {}).get("name_or_path")
    if name and not same_model(name, target.name):
        raise DraftDoesNotApply(f"EAGLE-3 head '{folder}' was trained for verifier '{name}'; the target is "
                                f"'{target.name}'")

