#!/usr/bin/env bash
# Paper figure speedup_vs_k: the k_sweep study at full size, then every figure it supports.
#   bash experiments/fig_speedup_vs_k.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/k_sweep/figures/speedup_vs_k.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" k_sweep "$@"
python -m specexp.figures multirun/k_sweep
