#!/usr/bin/env bash
# The A/A control: the speculative arm with drafts that never propose (draft=none, draft.k=0), whose
# speedup must be 1.00 within its interval, then its record (per-batch ratios of every timing pass).
#   bash experiments/aa_control.sh [extra Hydra overrides, e.g. batch_size=4 or logger=wandb]
# Keep the machine otherwise idle while it runs: on 2 cores another process stalls one arm.
# The record lands in benchmarks/aa_control.md, the table in multirun/aa_control/collected.{parquet,csv}.
set -euo pipefail
rm -rf multirun/aa_control  # one record, one run
bash "$(dirname "$0")/study.sh" aa_control "$@"
python "$(dirname "$0")/../benchmarks/aa_control.py" multirun/aa_control
