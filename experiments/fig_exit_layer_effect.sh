#!/usr/bin/env bash
# Paper figure exit_layer_effect: the exit_layer_sweep study (early exit at layer L, untrained and trained
# heads) at full size, then every figure it supports.
#   bash experiments/fig_exit_layer_effect.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/exit_layer_sweep/figures/exit_layer_effect.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" exit_layer_sweep "$@"
python -m specexp.figures multirun/exit_layer_sweep
