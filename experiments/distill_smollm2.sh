#!/usr/bin/env bash
# Reproduces the shipped draft=distilled (specexp/assets/distilled-smollm2-135m) and its benchmark:
#   bash experiments/distill_smollm2.sh
# ~12 min of corpus generation, ~6 min of teacher scoring, ~15 min of training on 2 CPU cores.
set -euo pipefail
python -m specexp.distill experiment=distill_smollm2 hydra.run.dir=outputs/distill_smollm2 \
  export_dir=specexp/assets/distilled-smollm2-135m "$@"
python benchmarks/bench_distilled.py --prompts 16 --max-new-tokens 64 --ks 1 2 3 4 6
