#!/usr/bin/env bash
# Reproduces the shipped draft=distilled (specexp/assets/distilled-smollm2-135m) and its benchmark:
#   bash experiments/distill_smollm2.sh
# On 2 CPU cores: ~24 min of corpus generation (2048 conversations, 365k tokens), ~12 min of
# teacher scoring (top-64 log-probs), ~33 min of training (3000 steps), ~17 min of benchmark.
set -euo pipefail
python -m specexp.distill experiment=distill_smollm2 hydra.run.dir=outputs/distill_smollm2 \
  export_dir=specexp/assets/distilled-smollm2-135m "$@"
python benchmarks/bench_distilled.py --prompts 16 --max-new-tokens 64 --ks 1 2 3 4 6
