#!/usr/bin/env bash
# Paper figure cost_quality_plane: the draft_compare study at full size, then every figure it supports.
#   bash experiments/fig_cost_quality_plane.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/draft_compare/figures/cost_quality_plane.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" draft_compare "$@"
python -m specexp.figures multirun/draft_compare
