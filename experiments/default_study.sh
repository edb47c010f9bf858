#!/usr/bin/env bash
# The default study as shipped (`python -m specexp`), then its record from what it measured.
#   bash experiments/default_study.sh [extra Hydra overrides]
# Keep the machine otherwise idle while it runs: on 2 cores another process stalls one arm.
# The record lands in benchmarks/default_study.md, the run in outputs/default_study.
set -euo pipefail
here="$(dirname "$0")"
rm -rf outputs/default_study  # one record, one run
python -m specexp hydra.run.dir=outputs/default_study "$@"
python "${here}/../benchmarks/study_record.py" outputs/default_study --title "The default study with intervals" \
    --out "${here}/../benchmarks/default_study.md"
