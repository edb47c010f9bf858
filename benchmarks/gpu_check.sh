#!/usr/bin/env bash
# The CUDA path in one prepared script, each step under its own time limit, the record to
# benchmarks/gpu_check/<date>-<card>.md with the card, driver, torch and each step's exit status and last lines:
#   tests    the gpu-marked tests (greedy identity on CUDA, CUDA graphs against eager, one sync per round)  90 s
#   pairs    benchmarks/gpu_pairs.py at Llama-3.1-8B / Llama-3.2-1B shapes in bf16, CUDA graphs         450 s
#   studies  the default study eager and compiled on the embedded target (needs its GGUF)             450 s
#   bash benchmarks/gpu_check.sh [STEPS]     (default: tests,pairs: 540 s, inside one 600 s device call)
# On a lent machine (`device` tool): run benchmarks/gpu_wheels.sh here first, carry .whl; the wheels are
# installed into /tmp/site. Where $OUT is set (the device tool's), the records are copied there.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=",${1:-tests,pairs},"
command -v nvidia-smi >/dev/null || { echo "error: nvidia-smi not found; this script checks the CUDA path" >&2; exit 2; }
PY=$(command -v python || command -v python3)
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: the carried wheels did not install" >&2; exit 2; }
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "error: torch sees no CUDA device (torch $("$PY" -c 'import torch; print(torch.__version__)'))" >&2; exit 2; }

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
  echo "Card: $card (driver $driver); torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)');"
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
    grep -E '^\[done\]|^speedup|^alpha|passed|failed|error|"stage"' "$log" | tail -n 20
    echo '```'
    echo
  } >>"$record"
  [ -n "${OUT:-}" ] && cp "$log" "$OUT/"
  return $rc
}

status=0
if [[ $steps == *,tests,* ]]; then
  # Collected from the files that mark any (the rest of the suite is not imported).
  mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
  step gpu_tests 90 "$PY" -m pytest -m gpu -n 0 -p no:cacheprovider -q "${gpu_files[@]}" || status=1
fi
if [[ $steps == *,pairs,* ]]; then
  # Writes benchmarks/gpu_pairs_gpu.md (and .jsonl, each result as it completes: a timeout keeps those).
  step gpu_pairs 450 bash -c "cd benchmarks && '$PY' gpu_pairs.py --shapes gpu" || status=1
  cat benchmarks/gpu_pairs_gpu.md >>"$record" 2>/dev/null
  [ -n "${OUT:-}" ] && cp benchmarks/gpu_pairs_gpu.md benchmarks/gpu_pairs_gpu.jsonl "$OUT/" 2>/dev/null
fi
if [[ $steps == *,studies,* ]]; then
  # The default study eager (host-bound on a GPU) and compiled, both fixed K = 3 and unpriced.
  for mode in eager compiled; do
    compile=$([ $mode = compiled ] && echo true || echo false)
    step "${mode}_study" 225 "$PY" -m specexp device=cuda runtime.compile=$compile runtime.compile_max_tokens=4 draft.k=3 \
      profile.enabled=false timing.budget_s=40 hydra.run.dir=multirun/gpu_check/$mode || status=1
    summary="multirun/gpu_check/$mode/summary.json"
    [ -f "$summary" ] && "$PY" - "$summary" "$mode" >>"$record" <<'EOF'
import json, sys
from specexp.study.divergence import steps_apart
s = json.load(open(sys.argv[1]))
print(f"- {sys.argv[2]}: speedup {s['speedup']:.3f} {s.get('speedup_ci95')}, alpha {s['alpha']}, tau {s['tau']:.3f}, "
      f"AR {s['tokens_per_s_ar']:.1f} tok/s, greedy_match {s['greedy_match']}, runtime {s['runtime'].get('name')}, "
      f"compiled passes {s['runtime'].get('compiled_passes')}, cudagraph skips {s['runtime'].get('cudagraph_skips')}")
for d in s.get("greedy_divergences") or []:  # where the greedy arms differ: the logit gap in rounding steps
    print(f"  - prompt {d['prompt_id']}: position {d['position']}, gap {d['logit_gap']:.4f} = "
          f"{steps_apart(d):.1f} rounding steps")
EOF
  done
fi
[ -n "${OUT:-}" ] && cp "$record" "$OUT/"
echo "record: $record"
exit $status
