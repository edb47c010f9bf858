#!/usr/bin/env bash
# Paper figure acceptance_curve: the k_sweep study at full size, then every figure it supports.
#   bash experiments/fig_acceptance_curve.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/k_sweep/figures/acceptance_curve.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" k_sweep "$@"
python -m specexp.figures multirun/k_sweep
