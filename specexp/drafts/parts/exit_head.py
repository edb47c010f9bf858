"""Exit heads: the hidden state after the target's layer L -> next-token logits.

Untrained, the head is the target's own final norm and LM head (shared modules), which is how
LayerSkip-trained models exit. A trained head puts a small residual MLP adapter (zero-initialised,
so training starts at the untrained head) before copies of the norm and the LM head, the head
optionally cut to a reduced draft vocabulary (N kept tokens + an "other" slot, like distilled
students). Saved as `exit_head.json` + `exit_head.safetensors` (+ `draft_vocab.json`).
"""

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

from specexp.core.kv import ForwardTraits, declares_forward
from specexp.draft_vocab import DraftVocab, restricted_head, vocab_fingerprint
from specexp.errors import DraftDoesNotApply, UserInputError
from specexp.models import LoadedModel, StudentTraits
from specexp.runtime.decoder import LeanDecoder, lean_decoder

HEAD_CONFIG = "exit_head.json"
HEAD_WEIGHTS = "exit_head.safetensors"


class ExitHead(nn.Module):
    """h [..., H] at the exit layer -> logits [..., C] (C = V, or N+1 with a draft vocabulary)."""

    def __init__(self, exit_layer: int, norm: nn.Module, lm_head: nn.Module, adapter_size: int = 0,
                 draft_vocab: DraftVocab | None = None, fingerprint: str | None = None):
        super().__init__()
        self.exit_layer, self.adapter_size = exit_layer, adapter_size
        self.draft_vocab, self.fingerprint = draft_vocab, fingerprint
        self.norm, self.lm_head = norm, lm_head
        self.adapter = None
        if adapter_size:
            H = lm_head.in_features
            self.adapter = nn.Sequential(copy.deepcopy(norm), nn.Linear(H, adapter_size), nn.SiLU(),
                                         nn.Linear(adapter_size, H))
            nn.init.zeros_(self.adapter[-1].weight)
            nn.init.zeros_(self.adapter[-1].bias)

    @classmethod
    def untrained(cls, decoder: LeanDecoder, exit_layer: int) -> "ExitHead":
        decoder.check_exit_layer(exit_layer)
        return cls(exit_layer, decoder.norm, decoder.lm_head)

    @classmethod
    def trainable(cls, decoder: LeanDecoder, exit_layer: int, adapter_size: int = 256,
                  draft_vocab: DraftVocab | None = None, fingerprint: str | None = None) -> "ExitHead":
        """Copies of the target's norm and LM head (rows cut to the draft vocabulary), fp32."""
        decoder.check_exit_layer(exit_layer)
        lm_head = restricted_head(decoder.lm_head.weight, draft_vocab)  # [C, H]
        head = cls(exit_layer, copy.deepcopy(decoder.norm).float(), lm_head, adapter_size, draft_vocab, fingerprint)
        return head.to(decoder.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(self.lm_head.weight.dtype)  # a trained head may differ from the trunk (fp32 vs bf16)
        if self.adapter is not None:
            hidden = hidden + self.adapter(hidden)
        return self.lm_head(self.norm(hidden))

    def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the target's vocabulary [..., V]: -inf outside a draft vocabulary's tokens."""
        logits = self(hidden)
        return logits if self.draft_vocab is None else self.draft_vocab.to_target_logits(logits)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, folder / HEAD_WEIGHTS)
        config = {"exit_layer": self.exit_layer, "adapter_size": self.adapter_size,
                  "hidden_size": self.lm_head.in_features, "output_size": self.lm_head.out_features,
                  "vocab_fingerprint": self.fingerprint}
        (folder / HEAD_CONFIG).write_text(json.dumps(config, indent=2))
        if self.draft_vocab is not None:
            self.draft_vocab.save(folder)

    @classmethod
    def load(cls, folder: str | Path, target: LoadedModel) -> "ExitHead":
        """A saved head, checked against the target it will read hidden states from."""
        folder = Path(folder).expanduser()
        if not (folder / HEAD_CONFIG).is_file():
            raise UserInputError(f"exit head '{folder}' does not exist (no {HEAD_CONFIG} there); "
                                 f"give a folder written by `python -m specexp.distill student=exit_head`")
        config = json.loads((folder / HEAD_CONFIG).read_text())
        decoder = target_decoder(target.model)
        fingerprint = vocab_fingerprint(target)
        hidden_size = decoder.config.get_text_config().hidden_size
        if config["hidden_size"] != hidden_size or config["vocab_fingerprint"] not in (None, fingerprint):
            raise DraftDoesNotApply(f"exit head '{folder}' was trained for another target (hidden size "
                                 f"{config['hidden_size']}, {config['vocab_fingerprint']}); '{target.name}' has "
                                 f"{hidden_size} and {fingerprint}")
        head = cls.trainable(decoder, config["exit_layer"], config["adapter_size"], DraftVocab.load(folder),
                             fingerprint)
        head.load_state_dict(load_file(folder / HEAD_WEIGHTS))
        return head.to(target.model.device, target.model.dtype).eval()


def target_decoder(model: nn.Module) -> LeanDecoder:
    """The target's lean decoder, whose layers an exit head reads, split at any layer."""
    try:
        return lean_decoder(model)
    except UserInputError as e:
        raise UserInputError(f"early exit needs a Llama-shaped target: {e}") from None


# core.kv.new_ragged_kv: its layers run through the target's lean decoder
@declares_forward(ForwardTraits(cache="static"))
class EarlyExitModel(nn.Module):
    """The target's layers 0..L-1 and an exit head, as a causal LM with the call signature the
    engine's KV cache and the distillation module use.

    The target is kept outside the module tree: parameters(), state_dict() and .to() are the
    head's alone, so training, checkpoints and export touch only the head. Inputs are always the
    target's ids (the trunk is the target's own); only the outputs may be a draft vocabulary.
    """


    def __init__(self, target_model: nn.Module, head: ExitHead, target_space_logits: bool = True):
        super().__init__()
        self._target = (target_model,)  # a tuple: not registered as a submodule
        self.decoder = target_decoder(target_model)
        self.config = target_model.config
        self.head = head
        self.target_space_logits = target_space_logits

    @property
    def device(self) -> torch.device:
        return self._target[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache=None, logits_to_keep: int = 0, **_) -> CausalLMOutput:
        B, T = input_ids.shape
        if position_ids is None:  # no cache: a whole sequence (distillation)
            position_ids = torch.arange(T, device=input_ids.device)[None].expand(B, T)
        hidden = self.decoder.embed(input_ids)  # [B, T, H]
        hidden = self.decoder.run_layers(hidden, range(self.head.exit_layer), cache, attention_mask, position_ids)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.head.target_logits(hidden) if self.target_space_logits else self.head(hidden)
        return CausalLMOutput(logits=logits)

    def save_pretrained(self, folder: str | Path) -> None:
        self.head.save(folder)


def exit_head_student(target: LoadedModel, exit_layer: int, adapter_size: int = 256,
                      draft_vocab: DraftVocab | None = None) -> LoadedModel:
    """A distillation student (`student=exit_head`): a trainable head over the frozen target's
    layer-`exit_layer` hidden states; `python -m specexp.distill` exports it as a head folder."""
    head = ExitHead.trainable(target_decoder(target.model), exit_layer, adapter_size, draft_vocab,
                              vocab_fingerprint(target))
    model = EarlyExitModel(target.model, head, target_space_logits=False)
    return LoadedModel(model=model.train(), tokenizer=target.tokenizer, name=f"exit-head-L{exit_layer}",
                       draft_vocab=draft_vocab, as_student=StudentTraits(generates=False, reads_target_ids=True,
                                                                         hf_folder=False))
