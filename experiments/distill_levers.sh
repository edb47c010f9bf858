#!/usr/bin/env bash
# What moves the distilled draft's greedy MT-bench acceptance (docs/lab_notes/distill_levers.md):
#   bash experiments/distill_levers.sh
# 0. The draft these levers started from: experiment=distill_smollm2 (free self-written turns;
#    the shipped draft until experiment=distill_smollm2_tasks replaced it), ~33 min of training.
# 1. Fine-tuning that draft on 256 fresh conversations (seed 1): answers written greedily vs
#    at T = 0.7, and user turns started by task words (corpus=self_chat_tasks) (~9 min each on 2 CPU cores).
# 2. Which of the target's layers a 2-layer (or 3-layer) student copies, 300 steps each on the
#    corpus and teacher caches of step 0 (~4 min each once those exist).
# 3. The objective's temperature: 0.5 instead of 1, 300 steps (re-scores the teacher, ~12 min).
# Then every export is ranked by benchmarks/teacher_forced.py (no timing).
set -euo pipefail
out=outputs/distill_levers
base=$out/distill_smollm2/student
[ -f $base/config.json ] || python -m specexp.distill experiment=distill_smollm2 hydra.run.dir=$out/distill_smollm2
finetune() {  # NAME OVERRIDES...: the base draft, 400 steps on a fresh 256-conversation corpus
  local name=$1; shift
  python -m specexp.distill student=small student.init_from=$base \
    draft_vocab_size=null objective=forward_kl teacher_top_k=64 seed=1 data.corpus.prompt_limit=256 \
    data.corpus.batch_size=64 trainer.max_steps=400 trainer.val_check_interval=200 optim.lr=3e-4 \
    optim.warmup_steps=20 hydra.run.dir=$out/$name "$@"
}
finetune finetune_T0 data.corpus.temperature=0
finetune finetune_T0.7 data.corpus.temperature=0.7
finetune finetune_tasks corpus=self_chat_tasks data.corpus.temperature=0.7
for layers in 0,1 0,29 0,1,29 28,29; do
  python -m specexp.distill experiment=distill_smollm2 "student.layers=[$layers]" trainer.max_steps=300 \
    trainer.val_check_interval=300 hydra.run.dir=$out/layers_${layers//,/_}
done
python -m specexp.distill experiment=distill_smollm2 temperature=0.5 trainer.max_steps=300 \
  trainer.val_check_interval=300 hydra.run.dir=$out/objective_T0.5
exports=($base specexp/assets/distilled-smollm2-135m $out/finetune_{T0,T0.7,tasks}/student
         $out/layers_{0_1,0_29,0_1_29,28_29}/student $out/objective_T0.5/student)
python benchmarks/teacher_forced.py "${exports[@]}" --out $out/mt_bench.md
python benchmarks/teacher_forced.py "${exports[@]}" --prompt-set self --out $out/self.md
