#!/usr/bin/env bash
# Paper figure batch_effect: the batch_sweep study at full size, then every figure it supports.
#   bash experiments/fig_batch_effect.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/batch_sweep/figures/batch_effect.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" batch_sweep "$@"
python -m specexp.figures multirun/batch_sweep
