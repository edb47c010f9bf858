"""Distilling feature drafts (`student=eagle`, `student=eagle3`): an EAGLE head trained on the
frozen target's hidden states, computed in each training step by the same target pass that
gives the teacher's distributions (nothing cached: one pass gives both).

The loss per unrolled step j (EAGLE-3's training-time test: step j reads step j-1's own outputs
and attends as drafting step j does) is the token objective (forward KL, TVD, ...) between the
teacher's next-token distribution and the head's, over the entries that step has; EAGLE-1 adds
a smooth-L1 regression of the head's output on the target's next features (its one feature
layer must then be the one it predicts).
"""

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specexp.core.kv import hidden_features
from specexp.distill.module import DistillModule
from specexp.distill.objectives import total_variation, warped_log_probs
from specexp.draft_vocab import DraftVocab
from specexp.drafts.eagle_head import EagleHead, check_hidden_layers, eagle3_layers
from specexp.errors import UserInputError
from specexp.models import LoadedModel


def teacher_pass(model: PreTrainedModel, input_ids: torch.Tensor,
                 hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits [B, T, V] and hidden states at ``hidden_layers`` side by side [B, T, F]."""
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
    return out.logits, hidden_features(out, hidden_layers)


def step_losses(head: EagleHead, outputs: list[tuple[torch.Tensor, torch.Tensor]], teacher_logits: torch.Tensor,
                loss_fn, temperature: float) -> list[torch.Tensor]:
    """The token loss (a scalar) of each unrolled step's logits (`EagleHead.unrolled`). Entry t
    reads the features at t and token t+1 and predicts token t+2: the teacher's distribution at
    position t+1."""
    log_p = warped_log_probs(teacher_logits[:, 1:], temperature)  # [B, T-1, V]
    if head.draft_vocab is not None:
        log_p = head.draft_vocab.coarsen_log_probs(log_p)  # [B, T-1, N+1]
    losses = []
    for step, (logits, _) in enumerate(outputs, start=1):
        kept = slice(step - 1, None)  # entries before step - 1 have no draft step `step`
        log_q = warped_log_probs(logits[:, kept], temperature)
        losses.append(loss_fn(log_p[:, kept].flatten(0, 1), log_q.flatten(0, 1)).mean())
    return losses


class FeatureDistillModule(DistillModule):
    """DistillModule for an EAGLE head: ``unroll_steps`` and ``feature_loss_weight`` come with the
    student (`eagle_student`). Validation logs what drafting sees at its first step (val/alpha,
    val/greedy_match, in the target's vocabulary at T = 1) and val/alpha_step{j} for later steps."""

    def _passes(self, input_ids: torch.Tensor):
        """The teacher's logits [B, T, V] and features [B, T, F]; the head's unrolled steps."""
        head = self.student
        teacher_logits, features = teacher_pass(self.teacher, input_ids, head.hidden_layers)
        return teacher_logits, features, head.unrolled(input_ids, features, head.unroll_steps)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        head = self.student
        teacher_logits, features, outputs = self._passes(batch["input_ids"])
        losses = step_losses(head, outputs, teacher_logits, self.loss_fn, self.hparams.temperature)
        loss = torch.stack(losses).mean()
        for step, value in enumerate(losses, start=1):
            self.log(f"train/loss_step{step}", value)
        if head.feature_loss_weight:
            h = outputs[0][1]  # [B, T-1, H]: entry t's output stands in for the features at t+1
            feature_loss = F.smooth_l1_loss(h.float(), features[:, 1:].float())
            self.log("train/feature_loss", feature_loss)
            loss = loss + head.feature_loss_weight * feature_loss
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        teacher_logits, _, outputs = self._passes(batch["input_ids"])
        losses = step_losses(self.student, outputs, teacher_logits, self.loss_fn, self.hparams.temperature)
        self.log("val/loss", losses[0])
        teacher = warped_log_probs(teacher_logits[:, 1:])
        for step, (logits, _) in enumerate(outputs, start=1):
            student = warped_log_probs(self.student.target_logits(logits))  # zero outside a draft vocabulary
            kept = slice(step - 1, None)
            alpha = 1 - total_variation(teacher[:, kept].flatten(0, 1), student[:, kept].flatten(0, 1)).mean()
            if step == 1:
                self.log("val/tvd", 1 - alpha)
                self.log("val/alpha", alpha, prog_bar=True)
                self.log("val/greedy_match", (teacher.argmax(-1) == student.argmax(-1)).float().mean())
            else:
                self.log(f"val/alpha_step{step}", alpha)


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
    return LoadedModel(model=head.train(), tokenizer=target.tokenizer, name=name, draft_vocab=draft_vocab)
