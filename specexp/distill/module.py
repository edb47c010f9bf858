"""The LightningModule: a student causal LM trained against the frozen target's distributions."""

import math

import lightning as L
import torch
from transformers import PreTrainedModel

from specexp.distill.objectives import objective, total_variation


class DistillModule(L.LightningModule):
    """Minimises objective(p_target, q_student) over every non-padding position.

    Validation logs what speculative decoding will see: val/alpha = 1 - TVD(p, q) (the
    expected acceptance of one sampled draft token at temperature 1, the checkpoint metric)
    and val/greedy_match (argmax agreement, the acceptance under greedy decoding).
    """

    def __init__(self, student: PreTrainedModel, teacher: PreTrainedModel, objective_name: str = "tvd",
                 temperature: float = 1.0, lr: float = 1e-3, weight_decay: float = 0.01, warmup_steps: int = 20):
        super().__init__()
        self.save_hyperparameters(ignore=["student", "teacher"])
        self.student = student
        self.teacher = teacher.eval().requires_grad_(False)
        self.loss_fn = objective(objective_name)
        self.strict_loading = False  # checkpoints hold the student only (see on_save_checkpoint)

    def _logits(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher and student logits at the real (unmasked) positions: [N, V] each."""
        with torch.no_grad():
            teacher = self.teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        student = self.student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        keep = batch["attention_mask"].bool()  # [B, T]
        V = teacher.shape[-1]
        return teacher[keep], student[keep][:, :V]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        teacher, student = self._logits(batch)
        loss = self.loss_fn(teacher, student, self.hparams.temperature).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        teacher, student = self._logits(batch)
        tvd = total_variation(teacher, student).mean()
        self.log("val/loss", self.loss_fn(teacher, student, self.hparams.temperature).mean())
        self.log("val/tvd", tvd)
        self.log("val/alpha", 1 - tvd, prog_bar=True)
        self.log("val/greedy_match", (teacher.argmax(-1) == student.argmax(-1)).float().mean())

    def configure_optimizers(self):
        decay = [p for n, p in self.student.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in self.student.named_parameters() if p.ndim < 2]
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
