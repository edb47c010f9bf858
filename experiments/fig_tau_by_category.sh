#!/usr/bin/env bash
# Paper figure tau_by_category: the draft_compare study at full size, then every figure it supports.
#   bash experiments/fig_tau_by_category.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/draft_compare/figures/tau_by_category.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" draft_compare "$@"
python -m specexp.figures multirun/draft_compare
