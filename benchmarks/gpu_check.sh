#!/usr/bin/env bash
# The CUDA path in one prepared script (at most 9 minutes on one GPU: its steps' limits add up to
# 540 s): the gpu-marked tests, the default study on the GPU, and the compiled decode under CUDA
# graphs, each under its own time limit; the record goes to benchmarks/gpu_check/<date>-<card>.md
# with the card, driver, torch and every command's exit status and headline line.
#   bash benchmarks/gpu_check.sh [extra Hydra overrides for both studies]
# Needs specexp installed with a CUDA build of torch and the embedded default target (the README's
# install command with your CUDA torch instead of the CPU pin). Run it on an otherwise idle GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "error: nvidia-smi not found; this script checks the CUDA path" >&2; exit 2; }
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "error: torch sees no CUDA device (torch $(python -c 'import torch; print(torch.__version__)'))" >&2; exit 2; }

card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
day=$(date +%F)
out_dir=benchmarks/gpu_check
mkdir -p "$out_dir" multirun/gpu_check
stem="$out_dir/$day-$(echo "$card" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-')"
record="$stem.md"
n=2; while [ -e "$record" ]; do record="$stem-$n.md"; n=$((n + 1)); done  # a day's earlier runs stay (a tenth too)
export WANDB_MODE=offline PYTHONUNBUFFERED=1

{
  echo "# CUDA path check, $day"
  echo
  echo "Card: $card (driver $driver); torch $(python -c 'import torch; print(torch.__version__, torch.version.cuda)');"
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1). Command: \`bash benchmarks/gpu_check.sh $*\`."
  echo
} >"$record"

step() {  # step NAME SECONDS COMMAND...: run it under a limit, keep its last lines, record its status
  local name=$1 limit=$2
  shift 2
  local log="multirun/gpu_check/$name.log"
  local start=$SECONDS
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  {
    echo "## $name: exit $rc in $((SECONDS - start)) s (limit $limit s)"
    echo
    echo '```'
    echo "$*"
    grep -E '^\[done\]|^speedup|^alpha|passed|failed|error' "$log" | tail -n 12
    echo '```'
    echo
  } >>"$record"
  return $rc
}

status=0
# Extra timed passes get 40 s per study (the default allows 120 s): the intervals say what that bought.
timing=(timing.budget_s=40)
# 1. The gpu-marked tests (greedy identity on CUDA, CUDA graphs against eager), slow ones included,
#    collected from the files that mark any (the rest of the suite is not imported).
mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
step gpu_tests 90 python -m pytest -m gpu -n 0 -p no:cacheprovider -q "${gpu_files[@]}" || status=1
# 2. The default study on the GPU (its hardware profile measured there first). Eager, it is host-bound
#    there: on an H200 ~100 ms per token, ~50 s of profile, ~11 s per batch (2026-12-04: 150 s was short).
step default_study 240 python -m specexp device=cuda hydra.run.dir=multirun/gpu_check/default "${timing[@]}" "$@" \
  || status=1
# 3. The compiled target pass under CUDA graphs (reduce-overhead), the same study at a fixed K = 3 and
#    unpriced: a profile would time, and so compile, every pass size up to 32 tokens (one graph per
#    power of two, each compiled before timing); K = 3 needs the graphs of 1, 2 and 4 tokens (prompt passes run eagerly).
step compiled_study 210 python -m specexp device=cuda runtime.compile=true runtime.compile_max_tokens=4 draft.k=3 \
  profile.enabled=false \
  hydra.run.dir=multirun/gpu_check/compiled "${timing[@]}" "$@" || status=1
for run in default compiled; do
  summary="multirun/gpu_check/$run/summary.json"
  [ -f "$summary" ] && python - "$summary" "$run" >>"$record" <<'EOF'
import json, sys
from specexp.study.divergence import steps_apart
s = json.load(open(sys.argv[1]))
print(f"- {sys.argv[2]}: speedup {s['speedup']:.3f} {s.get('speedup_ci95')}, alpha {s['alpha']}, tau {s['tau']:.3f}, "
      f"AR {s['tokens_per_s_ar']:.1f} tok/s, greedy_match {s['greedy_match']}, runtime {s['runtime'].get('name')}"
      f"{' compiled ' + str(s['runtime'].get('compile_mode')) if s['runtime'].get('compile') else ''}"
      f"{', compiled passes %s, cudagraph skips %s' % (s['runtime'].get('compiled_passes'), s['runtime'].get('cudagraph_skips')) if s['runtime'].get('compile') else ''}")
for d in s.get("greedy_divergences") or []:  # where the greedy arms differ: the logit gap in rounding steps
    print(f"  - prompt {d['prompt_id']}: position {d['position']}, gap {d['logit_gap']:.4f} = "
          f"{steps_apart(d):.1f} rounding steps")
EOF
done
echo "record: $record"
exit $status
