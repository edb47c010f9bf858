#!/usr/bin/env bash
# Paper figures pairing_matrix and pairing_scatter: the pairing study (targets x drafts, MT-bench and
# Spec-Bench, greedy and T = 0.7) at full size, the pairing prediction of each setting beside it, then
# every figure they support (the scatter sets each measured pair against its prediction).
#   bash experiments/fig_pairing_matrix.sh [extra Hydra overrides, e.g. logger=wandb]
# Finished jobs are skipped on a rerun; the figures land in multirun/pairing/figures/pairing_{matrix,scatter}.{pdf,png}.
set -euo pipefail
bash "$(dirname "$0")/study.sh" pairing "$@"
drafts=prompt_lookup,target_prefix,early_exit,distilled,eagle,medusa,smollm2_135m,gemma3_270m  # the study's
predicted=()
for data in mt_bench spec_bench; do
  for sampling in greedy nucleus; do
    out="multirun/pairing/predicted/${data}-${sampling}"
    python -m specexp.pairing --targets default,gemma3_270m --drafts "${drafts}" --out "${out}" \
      "data=${data}" "sampling=${sampling}" data.limit=8
    predicted+=("${out}")
  done
done
python -m specexp.figures multirun/pairing "${predicted[@]}"
