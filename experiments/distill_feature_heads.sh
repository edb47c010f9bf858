#!/usr/bin/env bash
# Reproduces the feature-draft heads shipped for the default target
# (specexp/assets/{eagle,eagle3,medusa}-smollm2-135m) and their benchmark:
#   bash experiments/distill_feature_heads.sh
# One corpus for all three (512 conversations the target wrote itself, ~15 min to build on 2 CPU
# cores, cached); then ~2-3 s per training step on 2 CPU cores (800, 800 and 600 steps).
set -euo pipefail
for recipe in eagle3 eagle medusa; do
  python -m specexp.distill experiment=distill_$recipe hydra.run.dir=outputs/distill_$recipe "$@"
  rm -rf specexp/assets/$recipe-smollm2-135m
  cp -r outputs/distill_$recipe/student specexp/assets/$recipe-smollm2-135m
done
python benchmarks/eagle.py
