#!/usr/bin/env bash
# How long the README's test command (`python -m pytest`, the default tier) takes on this machine,
# written to benchmarks/suite_time/<date>-<cpu>.md with the CPU model, cores, instruction set, torch,
# the commit, the outcome, wall and CPU seconds and the slowest tests. The suite must stay under
# ~15 minutes on a 2-core CPU (CONTRIBUTING.md); run this where a new CPU turns up (an AVX2-only
# Zen 3, say) and commit the record.
#   bash benchmarks/suite_time.sh [--cold | --first-run] [pytest args]
# --cold: empty specexp and inductor caches (the target's conversion, plans, profiles, n-gram corpora
# and compiled kernels all made by the tests); --first-run: the same, after the README's main job
# (`python -m specexp`, timed apart) has run on them, as a new user runs the two commands;
# default: the caches as they are.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=warm
case "${1:-}" in --cold) mode=cold; shift ;; --first-run) mode=first-run; shift ;; esac
day=$(date +%F)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
family=$(grep -m1 '^cpu family' /proc/cpuinfo | sed 's/.*: //'); model=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | sed 's/.*: //')
isa=$(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/ $//')
out_dir=benchmarks/suite_time
mkdir -p "$out_dir"
stem="$out_dir/$day-$(echo "$cpu family $family model $model" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')"
record="$stem.md"
n=2; while [ -e "$record" ]; do record="$stem-$n.md"; n=$((n + 1)); done  # earlier runs stay (a tenth too)
log=$(mktemp)
TIMEFORMAT='%R %U %S'
if [ "$mode" != warm ]; then
  export SPECEXP_CACHE="$(mktemp -d)" TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"
fi
main_job=""
if [ "$mode" = first-run ]; then
  run_dir=$(mktemp -d)
  { time python -m specexp "hydra.run.dir=$run_dir" >"$log.main" 2>&1; } 2>"$log.main.time"  # its results: a temp folder
  main_status=$?
  read -r main_wall _ _ <"$log.main.time"
  main_job="; before it, the README's main job (\`python -m specexp\`) took ${main_wall} s and exited $main_status"
  rm -rf "$run_dir" "$log.main" "$log.main.time"
fi

{ time python -m pytest -p no:cacheprovider --durations=15 "$@" >"$log" 2>&1; } 2>"$log.time"
status=$?
read -r wall user sys <"$log.time"

{
  echo "# Suite time, $day"
  echo
  echo "CPU: $cpu (family $family, model $model; ${isa:-no avx2}), $(nproc) logical cores, $(free -g | awk '/^Mem:/ {print $2}') GiB;"
  echo "torch $(python -c 'import torch; print(torch.__version__)'); commit $(git rev-parse --short HEAD)."
  case $mode in
    warm) state='caches as they were' ;;
    cold) state='cold: empty SPECEXP_CACHE and inductor cache' ;;
    first-run) state="a new user's: empty SPECEXP_CACHE and inductor cache$main_job" ;;
  esac
  echo "Command: \`python -m pytest${*:+ $*}\` ($state)."
  echo
  echo "- exit $status; $(grep -E '^=+ .*(passed|failed).* in ' "$log" | tail -n 1 | tr -d '=' | sed 's/^ *//;s/ *$//')"
  echo "- wall **${wall} s**; CPU ${user} s user + ${sys} s system (every worker and command together)"
  echo
  echo '```'
  awk '/slowest 15 durations/ {on = 1; next} on && /^=/ {exit} on && /^[0-9]/' "$log"
  echo '```'
} >"$record"
if [ "$mode" != warm ]; then rm -rf "$SPECEXP_CACHE" "$TORCHINDUCTOR_CACHE_DIR"; fi
rm -f "$log" "$log.time"
cat "$record"
echo "record: $record"
exit $status
