#!/usr/bin/env bash
# The distillation ablation (objective x data source x student) and its table:
#   bash experiments/distill_ablation.sh [extra Hydra overrides]
# Reuses the corpus and teacher caches of experiment=distill_smollm2 when they exist.
set -euo pipefail
python -m specexp.distill experiment=distill_ablation "$@"
python -m specexp.collect multirun/distill_ablation --markdown multirun/distill_ablation/table.md
