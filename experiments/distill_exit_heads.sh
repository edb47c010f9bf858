#!/usr/bin/env bash
# Reproduces the trained exit heads shipped for the default target
# (specexp/assets/exit-heads-smollm2-135m/L{6,12,18}) and the early-exit benchmark:
#   bash experiments/distill_exit_heads.sh
# The corpus and its teacher scores are the ones draft=distilled uses (cached after its recipe;
# ~13 min to build otherwise); then ~4, 6 and 8 min of training per head on 2 CPU cores.
set -euo pipefail
python -m specexp.distill -m experiment=distill_exit_heads hydra.sweep.dir=outputs/distill_exit_heads "$@"
python benchmarks/bench_early_exit.py
