#!/usr/bin/env bash
# A study with runtime.compile=true: the target's and the draft's steps compiled (inductor on a CPU, CUDA
# graphs on a GPU), every graph compiled before timing; then its record, with the passes that ran compiled
# per role and the graphs compiled while timing.
#   bash experiments/compiled_study.sh [extra Hydra overrides]   (default: the shipped distilled draft, K = 2)
# Unpriced (profile.enabled=false: a profile would time, so compile, every pass size up to 32 tokens) and with
# passes over more than 4 tokens eager (the prompts'): the graphs K = 2 takes, each minutes to compile on a CPU.
# Keep the machine otherwise idle while it runs: on 2 cores another process stalls one arm.
# The record lands in benchmarks/compiled_study.md, the run in outputs/compiled_study.
set -euo pipefail
here="$(dirname "$0")"
rm -rf outputs/compiled_study  # one record, one run
python -m specexp runtime.compile=true runtime.compile_max_tokens=4 profile.enabled=false draft=distilled draft.k=2 \
    hydra.run.dir=outputs/compiled_study "$@"
python "${here}/../benchmarks/study_record.py" outputs/compiled_study \
    --title "A study with the target's and the draft's steps compiled" --out "${here}/../benchmarks/compiled_study.md"
