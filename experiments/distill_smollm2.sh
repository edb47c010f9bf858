#!/usr/bin/env bash
# Reproduces the shipped draft=distilled (specexp/assets/distilled-smollm2-135m) and its benchmark:
#   bash experiments/distill_smollm2.sh
# experiment=distill_smollm2_tasks: the target writes 2048 conversations whose user turns start
# with task words (338k tokens; ~25 min of generation on 2 idle CPU cores, 44 min here with other
# jobs running), ~9 min of teacher scoring (top-64 log-probs), ~33 min of training (3000 steps),
# then ~40 min of benchmarks (16 prompts: fp32 vs int8 weights; 32 prompts: int8).
set -euo pipefail
python -m specexp.distill experiment=distill_smollm2_tasks hydra.run.dir=outputs/distill_smollm2_tasks \
  export_dir=specexp/assets/distilled-smollm2-135m "$@"
python benchmarks/bench_distilled.py --prompts 16 --max-new-tokens 64 --ks 1 2 --min-confidences 0 0.4 \
  --quantize none int8 --out benchmarks/distilled_int8.md --work outputs/bench_distilled_int8
python benchmarks/bench_distilled.py --prompts 32 --max-new-tokens 64 --ks 1 2 --min-confidences 0 0.3 0.4 \
  --quantize int8 --out benchmarks/distilled_int8_32.md --work outputs/bench_distilled_int8_32
