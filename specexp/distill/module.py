"""The LightningModule: a student causal LM trained against the frozen target's distributions."""

import math
import random

import lightning as L
import torch

from specexp.distill.objectives import coarsen, objective, total_variation, warped_log_probs, with_rest
from specexp.errors import UserInputError
from specexp.models import LoadedModel


def is_on_policy_step(seed: int, step: int, ratio: float) -> bool:
    """Whether training step `step` uses on-policy data: decided by (seed, step), so a resumed run
    makes the same choices, and a share `ratio` of steps does."""
    return ratio > 0 and random.Random(seed * 1_000_003 + step).random() < ratio


class DistillModule(L.LightningModule):
    """Minimises objective(p_target, q_student) over every position of a token block.

    Teacher targets come from the batch (`teacher_ids`/`teacher_log_probs`: cached top-k, the
    objective then compares the coarsened distributions) or from a live teacher pass (full
    distributions). With `on_policy_ratio` > 0 that share of steps trains on the student's own
    continuations of the batch's first `on_policy_prefix` tokens, scored live by the teacher
    (DistillSpec's on-policy data). A reduced-vocabulary student is trained on the teacher's
    distribution coarsened to its N kept tokens + "other".

    Validation logs what speculative decoding will see, in the target's vocabulary at
    temperature 1: val/alpha = 1 - TVD(p, q) (the expected acceptance of one sampled draft
    token, the checkpoint metric) and val/greedy_match (the acceptance under greedy decoding).
    """

    def __init__(self, student: LoadedModel, teacher: LoadedModel, objective_name: str = "tvd",
                 temperature: float = 1.0, lr: float = 1e-3, weight_decay: float = 0.01, warmup_steps: int = 20,
                 on_policy_ratio: float = 0.0, on_policy_prefix: int = 16, seed: int = 0):
        super().__init__()
        self.save_hyperparameters(ignore=["student", "teacher"])
        self.student, self.student_traits = student.model, student.as_student
        self.teacher = teacher.model.eval().requires_grad_(False)
        self.draft_vocab = student.draft_vocab
        self.loss_fn = objective(objective_name)
        if on_policy_ratio > 0 and not self.student_traits.generates:
            raise UserInputError(f"on_policy.ratio={on_policy_ratio} needs a student that generates on its own; "
                                 f"{type(self.student).__name__} does not (set on_policy.ratio=0)")
        self.strict_loading = False  # checkpoints hold the student only (see on_save_checkpoint)

    def _student_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target ids [B, T] -> student logits [B, T, C] (C = V, or N+1 for a reduced vocabulary)."""
        return self.student(input_ids=self._student_ids(input_ids)).logits

    def _student_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> the student's input ids (an exit head reads the target's own ids)."""
        if self.draft_vocab is None or self.student_traits.reads_target_ids:
            return input_ids
        return self.draft_vocab.to_draft(input_ids)

    @torch.no_grad()
    def _teacher_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.teacher(input_ids=input_ids).logits  # [B, T, V]

    def _student_space(self, teacher_logits: torch.Tensor) -> torch.Tensor:
        """Teacher logits [..., V] -> log p [..., C] in the student's vocabulary at the objective's temperature."""
        log_p = warped_log_probs(teacher_logits, self.hparams.temperature)
        return log_p if self.draft_vocab is None else self.draft_vocab.coarsen_log_probs(log_p)

    def _targets_and_predictions(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p, log q), each [n, C'] over the positions and categories the objective compares."""
        input_ids = batch["input_ids"]
        log_q = warped_log_probs(self._student_logits(input_ids), self.hparams.temperature).flatten(0, 1)  # [n, C]
        if "teacher_ids" in batch:  # cached top-k: compare on {top-k ids, rest}
            ids = batch["teacher_ids"].long().flatten(0, 1)  # [n, k]
            return with_rest(batch["teacher_log_probs"].float().flatten(0, 1)), coarsen(log_q, ids)
        return self._student_space(self._teacher_logits(input_ids)).flatten(0, 1), log_q

    def _on_policy(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The student continues each block's prefix (sampled, T=1); the teacher scores the continuation."""
        B, T = input_ids.shape
        P = min(self.hparams.on_policy_prefix, T - 1)
        prefix = input_ids[:, :P]
        with torch.no_grad():
            was_training = self.student.training
            self.student.eval()
            ids = self._student_ids(prefix)
            suppress = None if self.draft_vocab is None else [self.draft_vocab.size]  # never sample "other"
            out = self.student.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                        top_k=0, top_p=1.0, max_new_tokens=T - P, min_new_tokens=T - P,
                                        suppress_tokens=suppress, pad_token_id=0)
            self.student.train(was_training)
        written = out[:, P:] if self.draft_vocab is None else self.draft_vocab.to_target(out[:, P:])
        sequence = torch.cat([prefix, written], dim=1)  # [B, T], target ids
        scored = slice(P - 1, T - 1)  # positions whose next token the student wrote
        log_p = self._student_space(self._teacher_logits(sequence)[:, scored]).flatten(0, 1)
        log_q = warped_log_probs(self._student_logits(sequence)[:, scored], self.hparams.temperature).flatten(0, 1)
        return log_p, log_q

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        on_policy = is_on_policy_step(self.hparams.seed, self.global_step, self.hparams.on_policy_ratio)
        log_p, log_q = self._on_policy(batch["input_ids"]) if on_policy else self._targets_and_predictions(batch)
        loss = self.loss_fn(log_p, log_q).mean()
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/on_policy", float(on_policy))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        input_ids = batch["input_ids"]
        teacher, student = self._teacher_logits(input_ids), self._student_logits(input_ids)
        self.log("val/loss", self.loss_fn(self._student_space(teacher).flatten(0, 1),
                                          warped_log_probs(student, self.hparams.temperature).flatten(0, 1)).mean())
        if self.draft_vocab is not None:  # what the draft hands the verifier: zero outside its tokens
            student = self.draft_vocab.to_target_logits(student)
        tvd = total_variation(warped_log_probs(teacher).flatten(0, 1), warped_log_probs(student).flatten(0, 1)).mean()
        self.log("val/tvd", tvd)
        self.log("val/alpha", 1 - tvd, prog_bar=True)
        self.log("val/greedy_match", (teacher.argmax(-1) == student.argmax(-1)).float().mean())

    def configure_optimizers(self):
        trainable = [p for p in self.student.parameters() if p.requires_grad]
        decay = [p for p in trainable if p.ndim >= 2]
        no_decay = [p for p in trainable if p.ndim < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": self.hparams.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=self.hparams.lr)
        total = max(self.trainer.max_steps, 1) if self.trainer.max_steps and self.trainer.max_steps > 0 else 1000
        warmup = self.hparams.warmup_steps

        def schedule(step: int) -> float:  # linear warm-up, then cosine decay to 10%
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The frozen target is rebuilt from config on resume; keep checkpoints student-sized.
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("teacher.")}
