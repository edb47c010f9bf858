"""What every head that drafts from the target's hidden states shares (EAGLE's, Medusa's): the
layers it reads, the target it was built for, the reduced vocabulary it may predict, and saving
and loading a head folder checked against the target it will read.

A head holds the target's modules it uses (embedding, LM head) outside its module tree:
parameters(), state_dict() and .to() are the head's alone.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specexp.draft_vocab import DraftVocab, vocab_fingerprint
from specexp.errors import DraftDoesNotApply, UserInputError
from specexp.models import LoadedModel


@dataclass
class Prediction:
    """What training compares with the teacher: ``logits`` [B, n, C] for the teacher's positions
    first..first+n-1 (the distribution of the token after each)."""

    name: str  # val/alpha_{name}
    logits: torch.Tensor
    first: int
    weight: float = 1.0  # in the training loss
    hidden: torch.Tensor | None = None  # [B, n, H]: the head's stand-in for the target's features there (EAGLE)


def check_hidden_layers(hidden_layers: tuple[int, ...], n_layers: int) -> None:
    if not hidden_layers or any(not 0 <= j <= n_layers for j in hidden_layers):
        raise UserInputError(f"hidden_layers={list(hidden_layers)} is not allowed; give indices in 0..{n_layers} "
                             f"(0 the embeddings, j the output of layer j, {n_layers} the normed last state)")


def target_identity(target: LoadedModel) -> dict:
    """What a head must match in the target it reads: its width, depth and token ids."""
    text = target.model.config.get_text_config()
    return {"hidden_size": text.hidden_size, "target_layers": text.num_hidden_layers,
            "vocab_fingerprint": vocab_fingerprint(target)}


class FeatureHead(nn.Module):
    """A head over the target's hidden states at ``hidden_layers`` (transformers' numbering),
    predicting the target's vocabulary or a reduced one (N kept tokens + "other")."""

    kind = "feature"  # names the head in messages and files: {kind}_head.json, {kind}_head.safetensors
    student = "eagle"  # the `python -m specexp.distill student=...` that trains one
    # How training runs the head (specexp.distill.features.eagle_student sets them; a saved head keeps neither):
    unroll_steps = 1  # EAGLE-3's training-time test: the steps it runs on its own outputs
    feature_loss_weight = 0.0  # EAGLE-1/2's regression of its output on the target's features
    other_slot = True  # with a draft vocabulary it predicts N kept ids + "other" (False: the kept ids alone)

    def __init__(self, target: LoadedModel, hidden_layers: tuple[int, ...], draft_vocab: DraftVocab | None):
        super().__init__()
        identity = target_identity(target)
        check_hidden_layers(tuple(hidden_layers), identity["target_layers"])
        self.hidden_layers, self.target_layers = tuple(hidden_layers), identity["target_layers"]
        self.hidden_size = identity["hidden_size"]
        self.draft_vocab, self.fingerprint = draft_vocab, identity["vocab_fingerprint"]

    def options(self) -> dict:
        """The constructor's own arguments, as saved (JSON)."""
        raise NotImplementedError

    def predictions(self, input_ids: torch.Tensor, features: torch.Tensor) -> list[Prediction]:
        """Training: the head over whole sequences (target ids [B, T], the target's features at
        hidden_layers [B, T, F]); the first prediction is what drafting's first token sees."""
        raise NotImplementedError

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [..., C] -> [..., V] in the target's ids (-inf outside a draft vocabulary's tokens)."""
        return logits if self.draft_vocab is None else self.draft_vocab.to_target_logits(logits)

    @classmethod
    def files(cls) -> tuple[str, str]:
        return f"{cls.kind}_head.json", f"{cls.kind}_head.safetensors"

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config_file, weights_file = self.files()
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, folder / weights_file)
        config = {"hidden_layers": list(self.hidden_layers), "target_layers": self.target_layers,
                  "hidden_size": self.hidden_size, "vocab_fingerprint": self.fingerprint, **self.options()}
        (folder / config_file).write_text(json.dumps(config, indent=2))
        if self.draft_vocab is not None:
            self.draft_vocab.save(folder)

    def save_pretrained(self, folder: str | Path) -> None:  # what `specexp.distill` calls to export a student
        self.save(folder)

    @classmethod
    def load(cls, folder: str | Path, target: LoadedModel) -> "FeatureHead":
        """A saved head, checked against the target whose features and ids it reads."""
        folder = Path(folder).expanduser()
        config_file, weights_file = cls.files()
        if not (folder / config_file).is_file():
            raise UserInputError(f"{cls.kind} head '{folder}' does not exist (no {config_file} there); give a folder "
                                 f"written by `python -m specexp.distill student={cls.student}`")
        config = json.loads((folder / config_file).read_text())
        identity = target_identity(target)
        mine = {key: config[key] for key in identity}
        if mine != identity:
            raise DraftDoesNotApply(f"{cls.kind} head '{folder}' was trained for another target ({mine}); "
                                 f"'{target.name}' has {identity}")
        options = {k: v for k, v in config.items() if k not in identity and k not in ("hidden_layers", "output_size")}
        head = cls(target, tuple(config["hidden_layers"]), DraftVocab.load(folder), **options)
        head.load_state_dict({k: v.to(head.dtype) for k, v in load_file(folder / weights_file).items()})
        return head.eval()
