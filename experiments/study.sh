#!/usr/bin/env bash
# Run one study at full size and collect its jobs into one table:
#   bash experiments/study.sh k_sweep [extra Hydra overrides, e.g. logger=wandb]
# Studies: conf/experiment/*.yaml. The table lands in multirun/NAME/collected.{parquet,csv}.
set -euo pipefail
name="${1:?usage: bash experiments/study.sh EXPERIMENT [overrides...]}"
shift
python -m specexp "experiment=${name}" "$@"
python -m specexp.collect "multirun/${name}"
