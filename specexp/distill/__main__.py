"""`python -m specexp.distill [overrides]`: distil a draft from the target with Lightning, then
export the best student (by val/alpha) as an HF folder that `draft=small_lm draft.model=PATH` loads.

  python -m specexp.distill data.prompts=mt_bench trainer.max_steps=300
  python -m specexp.distill objective=forward_kl student.num_layers=4 ckpt_path=last   # resume
"""

import sys
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from specexp.__main__ import CONFIG_DIR, _user_error
from specexp.distill.data import DistillDataModule, corpus_documents
from specexp.distill.module import DistillModule
from specexp.errors import UserInputError


def distill(cfg: DictConfig, out_dir: Path) -> dict:
    """Train, then export the best student. Returns {'export_dir', 'best_alpha', 'best_checkpoint'}."""
    L.seed_everything(cfg.seed, workers=True)
    target = instantiate(cfg.target)
    if target.tokenizer is None:
        raise UserInputError(f"target '{target.name}' has no tokenizer")
    student = instantiate(cfg.student)(target)
    documents = corpus_documents(target, **cfg.data.corpus)
    data = DistillDataModule(documents, separator=target.eos_token_ids[0], **cfg.data.loader)
    module = DistillModule(student, target.model, cfg.objective, cfg.temperature, **cfg.optim)
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=out_dir / "checkpoints", monitor="val/alpha", mode="max",
                                                     save_last=True, filename="step{step}-alpha{val/alpha:.4f}",
                                                     auto_insert_metric_name=False)
    logger = instantiate(cfg.trainer_logger) if cfg.trainer_logger else False
    callbacks = [checkpoint]
    if logger:  # the LR monitor writes to the logger; Lightning refuses it without one
        callbacks.append(L.pytorch.callbacks.LearningRateMonitor(logging_interval="step"))
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, default_root_dir=str(out_dir))
    ckpt_path = cfg.ckpt_path
    if ckpt_path == "last":
        ckpt_path = str(out_dir / "checkpoints" / "last.ckpt")
    if ckpt_path and not Path(ckpt_path).exists():
        raise UserInputError(f"ckpt_path '{ckpt_path}' does not exist")
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)

    best = checkpoint.best_model_path or checkpoint.last_model_path
    state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
    student.load_state_dict({k[len("student."):]: v for k, v in state.items() if k.startswith("student.")})
    export_dir = Path(cfg.export_dir or out_dir / "student")
    student.to(getattr(torch, cfg.export_dtype)).save_pretrained(export_dir)
    target.tokenizer.save_pretrained(export_dir)
    best_alpha = float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None
    return {"export_dir": str(export_dir), "best_alpha": best_alpha, "best_checkpoint": best}


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="distill")
def main(cfg: DictConfig) -> float | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = distill(cfg, out_dir)
    except Exception as exc:
        error = _user_error(exc)
        if error is None:
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"best val/alpha {result['best_alpha']}; student exported to {result['export_dir']}")
    return result["best_alpha"]


if __name__ == "__main__":
    main()
