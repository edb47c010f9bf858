"""Distilling feature drafts (`student=eagle`, `student=eagle3`, `student=medusa`): heads trained on
the frozen target's hidden states, computed in each training step by the same target pass that
gives the teacher's distributions, or (`feature_cache=true`) read from a cache written once per
corpus: the hidden states at the head's layers and the normed last one, whose product with the
target's head is the teacher's logits exactly, so a step costs the head and one matmul instead
of the target's whole pass.

The loss is the token objective (forward KL, TVD, ...) between the teacher's next-token
distributions and each of the head's predictions (`FeatureHead.predictions`): per unrolled EAGLE
step j (EAGLE-3's training-time test: step j reads step j-1's own outputs and attends as
drafting step j does), per Medusa head i (the token i+2 ahead). EAGLE-1 adds a smooth-L1
regression of the head's output on the target's next features (its one feature layer must then
be the one it predicts).
"""

from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specexp.core.kv import hidden_features
from specexp.distill.data import beside_corpus
from specexp.distill.module import DistillModule
from specexp.distill.objectives import total_variation, warped_log_probs
from specexp.draft_vocab import DraftVocab
from specexp.drafts.parts.eagle3_head import Eagle3Head, layer_config
from specexp.drafts.parts.eagle_head import EagleHead, eagle3_layers
from specexp.drafts.parts.feature_head import FeatureHead, Prediction, check_hidden_layers
from specexp.drafts.parts.medusa_heads import MedusaHeads
from specexp.errors import UserInputError
from specexp.models import LoadedModel, StudentTraits
from specexp.ngram.corpus import map_fingerprint


def teacher_pass(model: PreTrainedModel, input_ids: torch.Tensor,
                 hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits [B, T, V] and hidden states at ``hidden_layers`` side by side [B, T, F]."""
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
    if out.hidden_states is None:  # transformers records none for a model unpickled into a fresh process
        raise UserInputError(f"{type(model).__name__} returned no hidden states; with several devices use "
                             "trainer.strategy=ddp (ddp_spawn hands each process an unpickled model)")
    return out.logits, hidden_features(out, hidden_layers)


def cached_layers(hidden_layers: tuple[int, ...], n_layers: int) -> tuple[int, ...]:
    """What a feature cache keeps: the head's layers, then the normed last state (the teacher's
    logits) unless the head reads it already."""
    return hidden_layers if n_layers in hidden_layers else (*hidden_layers, n_layers)


def feature_cache_bytes(n_blocks: int, block_size: int, layers: tuple[int, ...], hidden_size: int) -> int:
    return n_blocks * block_size * len(layers) * hidden_size * 4  # float32: exact for fp32 and bf16 targets


@torch.no_grad()
def with_target_features(dataset: datasets.Dataset, target: LoadedModel, layers: tuple[int, ...],
                         batch_size: int = 8, scratch_file: Path | None = None) -> datasets.Dataset:
    """Adds `features` [T, len(layers) * H] (float32): the target's hidden states at ``layers``
    for every block, one target pass per block for the whole run (written to ``scratch_file``,
    not beside the corpus, so the caller can drop it once the result is saved)."""
    device = target.model.device

    def score(batch: dict) -> dict:
        ids = torch.as_tensor(batch["input_ids"], device=device)  # [b, T]
        out = target.model(input_ids=ids, output_hidden_states=True)
        return {"features": hidden_features(out, layers).float().cpu().numpy()}  # [b, T, F]

    shape = (len(dataset[0]["input_ids"]), len(layers) * target.model.config.get_text_config().hidden_size)
    schema = datasets.Features({**dataset.features, "features": datasets.Array2D(shape, "float32")})
    return dataset.map(score, batched=True, batch_size=batch_size, features=schema, writer_batch_size=8 * batch_size,
                       cache_file_name=None if scratch_file is None else str(scratch_file),
                       desc=f"target hidden states at layers {list(layers)}",
                       new_fingerprint=map_fingerprint(dataset, "features", *feature_key(target, layers)))


def feature_cache_path(corpus: datasets.Dataset, target: LoadedModel, layers: tuple[int, ...]) -> Path:
    """Where a corpus's feature cache lives: next to it, keyed by the target, its dtype and the layers."""
    return beside_corpus(corpus, "features", *feature_key(target, layers))


def feature_key(target: LoadedModel, layers: tuple[int, ...]) -> tuple:
    """Everything a corpus's cached hidden states depend on: the target, its dtype and the layers."""
    return target.name, str(target.model.dtype), list(layers)


@torch.no_grad()
def teacher_from_cache(cached: torch.Tensor, hidden_layers: tuple[int, ...], n_layers: int,
                       lm_head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A cached batch [B, T, len(cached_layers) * H] -> the teacher's logits [B, T, V] (its head over
    the normed last state, in the head's dtype as the target's pass computes them) and the head's
    features [B, T, F]."""
    layers = cached_layers(hidden_layers, n_layers)
    blocks = cached.to(lm_head.weight.dtype).chunk(len(layers), dim=-1)  # per layer [B, T, H]
    return lm_head(blocks[layers.index(n_layers)]), torch.cat(blocks[: len(hidden_layers)], dim=-1)


def prediction_losses(head: FeatureHead, predictions: list[Prediction], teacher_logits: torch.Tensor, loss_fn,
                      temperature: float) -> list[torch.Tensor]:
    """The token loss (a scalar) of each prediction against the teacher's distributions at its
    positions, in the head's vocabulary."""
    log_p = warped_log_probs(teacher_logits, temperature)  # [B, T, V]
    if head.draft_vocab is not None:  # [B, T, N+1], or [B, T, N]: the kept ids renormalised (no "other" output)
        log_p = head.draft_vocab.coarsen_log_probs(log_p) if head.other_slot else head.draft_vocab.kept_log_probs(log_p)
    losses = []
    for p in predictions:
        n = p.logits.shape[1]
        log_q = warped_log_probs(p.logits, temperature)
        losses.append(loss_fn(log_p[:, p.first : p.first + n].flatten(0, 1), log_q.flatten(0, 1)).mean())
    return losses


class FeatureDistillModule(DistillModule):
    """DistillModule for a head over the target's features (EAGLE's steps, Medusa's heads: the
    head's `predictions`, weighted). Validation logs what drafting's first token sees (val/alpha,
    val/greedy_match, in the target's vocabulary at T = 1) and val/alpha_{name} for the others."""

    def _passes(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, list[Prediction]]:
        """The teacher's logits [B, T, V] and features [B, T, F] (from the batch's cached `features`,
        or a live target pass); the head's predictions."""
        head, input_ids = self.student, batch["input_ids"]
        if "features" in batch:
            teacher_logits, features = teacher_from_cache(batch["features"], head.hidden_layers, head.target_layers,
                                                          self.teacher.get_output_embeddings())
        else:
            teacher_logits, features = teacher_pass(self.teacher, input_ids, head.hidden_layers)
        return teacher_logits, features, head.predictions(input_ids, features)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        head = self.student
        teacher_logits, features, predictions = self._passes(batch)
        losses = prediction_losses(head, predictions, teacher_logits, self.loss_fn, self.hparams.temperature)
        loss = sum(p.weight * value for p, value in zip(predictions, losses, strict=True))
        for p, value in zip(predictions, losses, strict=True):
            self.log(f"train/loss_{p.name}", value)
        if head.feature_loss_weight:
            first = predictions[0]  # its hidden states stand in for the target's features at its positions
            n = first.hidden.shape[1]
            feature_loss = F.smooth_l1_loss(first.hidden.float(), features[:, first.first : first.first + n].float())
            self.log("train/feature_loss", feature_loss)
            loss = loss + head.feature_loss_weight * feature_loss
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        head = self.student
        teacher_logits, _, predictions = self._passes(batch)
        losses = prediction_losses(head, predictions, teacher_logits, self.loss_fn, self.hparams.temperature)
        self.log("val/loss", losses[0])
        teacher = warped_log_probs(teacher_logits)
        for i, p in enumerate(predictions):
            n = p.logits.shape[1]
            expected = teacher[:, p.first : p.first + n].flatten(0, 1)
            student = warped_log_probs(head.target_logits(p.logits)).flatten(0, 1)  # zero outside a draft vocabulary
            alpha = 1 - total_variation(expected, student).mean()
            if i == 0:
                self.log("val/tvd", 1 - alpha)
                self.log("val/alpha", alpha, prog_bar=True)
                self.log("val/greedy_match", (expected.argmax(-1) == student.argmax(-1)).float().mean())
            else:
                self.log(f"val/alpha_{p.name}", alpha)


# a head over the target's hidden states: trained on them, exported as its own head folder
FEATURE_HEAD = StudentTraits(generates=False, reads_features=True, hf_folder=False)


def eagle_student(target: LoadedModel, hidden_layers: list[int] | str | None = None, unroll_steps: int = 1,
                  feature_loss_weight: float = 0.0, intermediate_size: int | None = None,
                  draft_vocab: DraftVocab | None = None, seed: int = 0) -> LoadedModel:
    """A fresh EAGLE head for the target (`student=eagle`: the normed top state; `student=eagle3`:
    hidden_layers=eagle3, the low/middle/high layers); `python -m specexp.distill` trains it and
    exports a head folder for `draft=eagle draft.head=PATH`."""
    n_layers = target.model.config.get_text_config().num_hidden_layers
    layers = (n_layers,) if hidden_layers is None else eagle3_layers(n_layers) if hidden_layers == "eagle3" \
        else tuple(int(j) for j in hidden_layers)
    check_hidden_layers(layers, n_layers)
    if unroll_steps < 1:
        raise UserInputError(f"student.unroll_steps={unroll_steps} is not allowed; it must be >= 1")
    if feature_loss_weight and len(layers) != 1:
        raise UserInputError(f"student.feature_loss_weight={feature_loss_weight} regresses the head's output on one "
                             f"feature layer; hidden_layers={list(layers)} has {len(layers)} (set it to 0)")
    torch.manual_seed(seed)
    head = EagleHead(target, layers, draft_vocab, intermediate_size=intermediate_size).float()
    head.unroll_steps, head.feature_loss_weight = unroll_steps, feature_loss_weight
    name = f"eagle-{'-'.join(map(str, layers))}"
    return LoadedModel(model=head.train(), tokenizer=target.tokenizer, name=name, draft_vocab=draft_vocab,
                       as_student=FEATURE_HEAD)


def eagle3_student(target: LoadedModel, hidden_layers: list[int] | None = None, unroll_steps: int = 3,
                   intermediate_size: int | None = None, norm_before_residual: bool = False,
                   norm_before_fc: bool = False, fc_norm: bool = False, norm_output: bool = False,
                   draft_vocab: DraftVocab | None = None, seed: int = 0) -> LoadedModel:
    """A fresh EAGLE-3 head as published (`student=eagle3`, drafts/parts/eagle3_head.py) for the target:
    its low, middle and high states (or ``hidden_layers``, hidden-state indices) fused, trained with
    ``unroll_steps`` steps of the training-time test; exported in the speculators format that vLLM serves
    and `draft=eagle draft.head=PATH` loads."""
    n_layers = target.model.config.get_text_config().num_hidden_layers
    layers = eagle3_layers(n_layers) if hidden_layers is None else tuple(int(j) for j in hidden_layers)
    check_hidden_layers(layers, n_layers)
    if unroll_steps < 1:
        raise UserInputError(f"student.unroll_steps={unroll_steps} is not allowed; it must be >= 1")
    torch.manual_seed(seed)
    config = layer_config(target, intermediate_size)
    head = Eagle3Head(target, layers, draft_vocab, config, norm_before_residual=norm_before_residual,
                      norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=norm_output).float()
    head.unroll_steps = unroll_steps
    return LoadedModel(model=head.train(), tokenizer=target.tokenizer, name=f"eagle3-{'-'.join(map(str, layers))}",
                       draft_vocab=head.draft_vocab if draft_vocab is not None else None, as_student=FEATURE_HEAD)


def medusa_student(target: LoadedModel, n_heads: int = 4, n_blocks: int = 1, draft_vocab: DraftVocab | None = None,
                   seed: int = 0) -> LoadedModel:
    """Fresh Medusa heads for the target (`student=medusa`), over its normed last state; exported
    as a head folder for `draft=medusa draft.head=PATH`."""
    torch.manual_seed(seed)
    heads = MedusaHeads(target, None, draft_vocab, n_heads=n_heads, n_blocks=n_blocks).float()
    return LoadedModel(model=heads.train(), tokenizer=target.tokenizer, name=f"medusa-{n_heads}x{n_blocks}",
                       draft_vocab=draft_vocab, as_student=FEATURE_HEAD)
