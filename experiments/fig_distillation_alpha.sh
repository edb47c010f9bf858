#!/usr/bin/env bash
# Paper figure distillation_alpha: the distillation ablation, then its figures.
#   bash experiments/fig_distillation_alpha.sh [extra Hydra overrides]
set -euo pipefail
bash "$(dirname "$0")/distill_ablation.sh" "$@"
python -m specexp.figures multirun/distill_ablation
