#!/usr/bin/env bash
# Paper figure tree_budget: the tree_sweep study at full size, then every figure it supports.
#   bash experiments/fig_tree_budget.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/tree_sweep/figures/tree_budget.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" tree_sweep "$@"
python -m specexp.figures multirun/tree_sweep
