#!/usr/bin/env bash
# Paper figure realized_vs_predicted: the model_check study (draft=oracle: acceptance and cost set by
# hand) at full size, then every figure it supports.
#   bash experiments/fig_model_check.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/model_check/figures/realized_vs_predicted.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" model_check "$@"
python -m specexp.figures multirun/model_check
