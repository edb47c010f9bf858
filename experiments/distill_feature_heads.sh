#!/usr/bin/env bash
# Reproduces the feature-draft heads shipped for the default target
# (specexp/assets/{eagle3,medusa}-smollm2-135m) and their benchmark:
#   bash experiments/distill_feature_heads.sh
# One corpus for both (512 conversations the target wrote itself, ~15 min to build on 2 CPU cores,
# cached); then ~2.7 and ~6 s per training step on 2 CPU cores (800 and 400 steps). The EAGLE-1
# recipe, experiment=distill_eagle, trains the same way.
set -euo pipefail
for recipe in eagle3 medusa; do
  python -m specexp.distill experiment=distill_$recipe hydra.run.dir=outputs/distill_$recipe "$@"
  rm -rf specexp/assets/$recipe-smollm2-135m
  cp -r outputs/distill_$recipe/student specexp/assets/$recipe-smollm2-135m
done
python benchmarks/eagle.py
