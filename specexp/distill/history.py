"""Validation metrics over training steps, one JSON line per validation, whatever the logger."""

import json
from pathlib import Path

import lightning as L


class MetricsHistory(L.Callback):
    """Appends {step, val/...} after each validation to a jsonl file (what the figures read)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        row = {"step": trainer.global_step,
               **{k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
