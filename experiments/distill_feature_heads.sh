#!/usr/bin/env bash
# Reproduces the feature-draft heads shipped for the default target
# (specexp/assets/{eagle3,medusa}-smollm2-135m) and their benchmark:
#   bash experiments/distill_feature_heads.sh
# One corpus for both (2048 conversations the target wrote itself, ~60 min to build on 2 CPU cores,
# cached; the EAGLE-3 recipe caches the target's features beside it); then ~1.4-1.9 and ~6 s per
# training step on 2 CPU cores (2000 and 400 steps). The EAGLE-3 head ships in the speculators format
# vLLM serves (bf16, the target's embedding left out); student=eagle3_fc trains specexp's earlier variant,
# experiment=distill_eagle the EAGLE-1 recipe.
set -euo pipefail
python -m specexp.distill experiment=distill_eagle3 hydra.run.dir=outputs/distill_eagle3 "$@"
rm -rf specexp/assets/eagle3-smollm2-135m
python -m specexp.export outputs/distill_eagle3/student --format speculators --out specexp/assets/eagle3-smollm2-135m \
  --verifier HuggingFaceTB/SmolLM2-135M-Instruct --speculative-tokens 8 --no-embedding --dtype bfloat16
python -m specexp.distill experiment=distill_medusa hydra.run.dir=outputs/distill_medusa "$@"
rm -rf specexp/assets/medusa-smollm2-135m
cp -r outputs/distill_medusa/student specexp/assets/medusa-smollm2-135m
python benchmarks/eagle.py
earlier=$(mktemp -d)  # the earlier variant's head, shipped as eagle3 until 2026-12-07
git archive 30f7385 specexp/assets/eagle3-smollm2-135m | tar -x -C "$earlier"
python benchmarks/eagle3_heads.py --earlier "$earlier/specexp/assets/eagle3-smollm2-135m"
