"""`python -m specexp.distill [overrides]`: distil a draft from the target with Lightning, then
export the best student (by val/alpha) as an HF folder that `draft=small_lm draft.model=PATH` loads.

  python -m specexp.distill student=from_target draft_vocab_size=8192 trainer.max_steps=300
  python -m specexp.distill experiment=distill_smollm2 hydra.run.dir=outputs/distill_smollm2 ckpt_path=last  # resume
  python -m specexp.distill student=exit_head student.exit_layer=12 draft_vocab_size=8192  # an exit head
  python -m specexp.distill student=eagle3 draft_vocab_size=8192  # an EAGLE-3 head (student=eagle: EAGLE-1)
  python -m specexp.distill student=medusa draft_vocab_size=8192   # Medusa heads
"""

import json
import sys
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from specexp.cli import one_line_errors
from specexp.configs import check_before_hydra
from specexp.distill.data import (
    DistillDataModule,
    cached_dataset,
    corpus_dataset,
    documents_from_blocks,
    teacher_cache_path,
    with_teacher_top_k,
)
from specexp.distill.features import (
    FeatureDistillModule,
    cached_layers,
    feature_cache_bytes,
    feature_cache_path,
    with_target_features,
)
from specexp.distill.history import MetricsHistory
from specexp.distill.module import DistillModule
from specexp.distill.objectives import objective
from specexp.draft_vocab import DraftVocab, frequent_tokens, vocab_fingerprint
from specexp.drafts.registry import use_line
from specexp.errors import UserInputError
from specexp.models import LoadedModel, resolve_device, resolve_dtype
from specexp.paths import CONFIG_DIR


def distill(cfg: DictConfig, out_dir: Path) -> dict:
    """Train, then export the best student. Returns {'export_dir', 'best_alpha', 'best_checkpoint', ...}."""
    L.seed_everything(cfg.seed, workers=True)
    target = instantiate(cfg.target)
    if target.tokenizer is None:
        raise UserInputError(f"target '{target.name}' has no tokenizer")
    objective(cfg.objective)  # refuse an unknown name before the (long) corpus generation
    corpus_cfg = OmegaConf.to_container(cfg.data.corpus, resolve=True)
    corpus = corpus_dataset(target, corpus_cfg, cfg.data.block_size, cfg.data.cache_dir)
    vocab = None
    if cfg.draft_vocab_size:
        vocab = DraftVocab(frequent_tokens(documents_from_blocks(corpus), cfg.draft_vocab_size, target.eos_token_ids),
                           target.vocab_size, vocab_fingerprint(target))
    student = instantiate(cfg.student)(target, draft_vocab=vocab)
    if vocab is not None and student.draft_vocab is not vocab:
        raise UserInputError("draft_vocab_size must be null with student.init_from: "
                             "the checkpoint brings its own vocabulary")
    dataset = corpus
    reads_features = student.as_student.reads_features
    if cfg.feature_cache and not reads_features:
        raise UserInputError(f"feature_cache=true caches a feature head's inputs; student '{student.name}' reads none "
                             f"(use teacher_top_k)")
    if reads_features and cfg.feature_cache:
        dataset = feature_cached_corpus(corpus, target, student.model.hidden_layers, cfg.data.batch_size)
    elif reads_features and cfg.teacher_top_k:
        print(f"{student.name} reads the target's hidden states: one live target pass per step gives them and the "
              f"teacher's distributions (teacher_top_k={cfg.teacher_top_k} unused; feature_cache=true caches them)")
    elif cfg.teacher_top_k:
        dataset = cached_dataset(teacher_cache_path(corpus, target, cfg.teacher_top_k, cfg.temperature,
                                                    student.draft_vocab),
                                 lambda: with_teacher_top_k(corpus, target, cfg.teacher_top_k, cfg.temperature,
                                                            student.draft_vocab, cfg.data.batch_size))
    data = DistillDataModule(dataset, cfg.data.batch_size, cfg.data.val_fraction, cfg.seed)
    module_class = FeatureDistillModule if reads_features else DistillModule
    module = module_class(student, target, cfg.objective, cfg.temperature, **cfg.optim,
                          on_policy_ratio=cfg.on_policy.ratio, on_policy_prefix=cfg.on_policy.prefix, seed=cfg.seed)
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=out_dir / "checkpoints", monitor="val/alpha", mode="max",
                                                     save_last=True, filename="step{step}-alpha{val/alpha:.4f}",
                                                     auto_insert_metric_name=False)
    logger = instantiate(cfg.trainer_logger) if cfg.trainer_logger else False
    callbacks = [checkpoint, MetricsHistory(out_dir / "metrics.jsonl")]
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
    student.model.load_state_dict({k[len("student."):]: v for k, v in state.items() if k.startswith("student.")})
    export_dir = Path(cfg.export_dir or out_dir / "student")
    export_student(student, export_dir, cfg.export_dtype)
    result = {"export_dir": str(export_dir), "best_checkpoint": best,
              "best_alpha": float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None,
              "corpus_tokens": len(corpus) * cfg.data.block_size, "steps": trainer.global_step,
              "draft_vocab_size": None if student.draft_vocab is None else student.draft_vocab.size,
              "parameters": sum(p.numel() for p in student.model.parameters())}
    (out_dir / "result.json").write_text(json.dumps(result, indent=2))
    return result


def feature_cached_corpus(corpus, target: LoadedModel, hidden_layers: tuple[int, ...], batch_size: int):
    """The corpus with the target's hidden states for a feature head, cached beside it (its size
    printed before it is written)."""
    text = target.model.config.get_text_config()
    layers = cached_layers(hidden_layers, text.num_hidden_layers)
    path = feature_cache_path(corpus, target, layers)
    size = feature_cache_bytes(len(corpus), len(corpus[0]["input_ids"]), layers, text.hidden_size)
    print(f"feature cache: hidden states {list(layers)} of {len(corpus)} blocks, {size / 2**30:.2f} GiB at {path}"
          + ("" if (path / "dataset_info.json").exists() else " (writing it now: one target pass per block)"))
    scratch = path.with_name(path.name + ".map.arrow")  # the pass's own output, copied into the cache
    dataset = cached_dataset(path, lambda: with_target_features(corpus, target, layers, batch_size, scratch))
    scratch.unlink(missing_ok=True)
    return dataset


def export_student(student: LoadedModel, folder: Path, dtype: str) -> None:
    """An HF folder that `draft=small_lm draft.model=FOLDER` loads: weights, tokenizer, draft vocabulary.
    An exit head writes its own folder (weights, config, draft vocabulary; it reads the target's ids)."""
    student.model.to(getattr(torch, dtype)).save_pretrained(folder)
    if not student.as_student.hf_folder:
        return
    if student.tokenizer is not None:
        student.tokenizer.save_pretrained(folder)
    if student.draft_vocab is not None:
        student.draft_vocab.save(folder)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="distill")
def main(cfg: DictConfig) -> float | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    with one_line_errors():
        result = distill(cfg, out_dir)
    print(f"best val/alpha {result['best_alpha']}; student exported to {result['export_dir']}")
    if (use := use_line(HydraConfig.get().runtime.choices.get("student"), result["export_dir"])) is not None:
        print(f"decode with it: {use}")  # the draft whose card says this student trains it
    return result["best_alpha"]


def check_distill_config(cfg: DictConfig) -> None:
    """What a distillation's config can be wrong in before the target loads (each a one-line UserInputError)."""
    objective(cfg.objective)
    resolve_dtype(cfg.dtype, resolve_device(cfg.device))
    if cfg.ckpt_path not in (None, "last") and not Path(cfg.ckpt_path).exists():
        raise UserInputError(f"ckpt_path '{cfg.ckpt_path}' does not exist; give a .ckpt file, 'last' or null")


if __name__ == "__main__":
    check_before_hydra("distill", sys.argv[1:], check_distill_config)
    main()
