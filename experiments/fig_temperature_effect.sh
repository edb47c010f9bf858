#!/usr/bin/env bash
# Paper figure temperature_effect: the temperature_sweep study at full size, then every figure it supports.
#   bash experiments/fig_temperature_effect.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figure lands in multirun/temperature_sweep/figures/temperature_effect.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" temperature_sweep "$@"
python -m specexp.figures multirun/temperature_sweep
