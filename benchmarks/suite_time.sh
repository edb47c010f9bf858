#!/usr/bin/env bash
# How long the README's test command (`python -m pytest`, the default tier) takes on this machine,
# written to benchmarks/suite_time/<date>-<cpu>.md with the CPU model, cores, instruction set, torch,
# the commit, the outcome, wall and CPU seconds and the slowest tests. The suite must stay under
# ~15 minutes on a 2-core CPU (CONTRIBUTING.md); run this where a new CPU turns up (an AVX2-only
# Zen 3, say) and commit the record.
#   bash benchmarks/suite_time.sh [--cold] [pytest args]
# --cold: empty specexp and inductor caches (a new user's first run: the target's conversion,
# profiles, n-gram corpora and compiled kernels made here); default: the caches as they are.
set -uo pipefail
cd "$(dirname "$0")/.."
cold=false
if [ "${1:-}" = "--cold" ]; then cold=true; shift; fi
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
if $cold; then
  export SPECEXP_CACHE="$(mktemp -d)" TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"
fi

TIMEFORMAT='%R %U %S'
{ time python -m pytest -p no:cacheprovider --durations=15 "$@" >"$log" 2>&1; } 2>"$log.time"
status=$?
read -r wall user sys <"$log.time"

{
  echo "# Suite time, $day"
  echo
  echo "CPU: $cpu (family $family, model $model; ${isa:-no avx2}), $(nproc) logical cores, $(free -g | awk '/^Mem:/ {print $2}') GiB;"
  echo "torch $(python -c 'import torch; print(torch.__version__)'); commit $(git rev-parse --short HEAD)."
  echo "Command: \`python -m pytest${*:+ $*}\` ($($cold && echo 'cold: empty SPECEXP_CACHE and inductor cache' || echo 'caches as they were'))."
  echo
  echo "- exit $status; $(grep -E '^=+ .*(passed|failed).* in ' "$log" | tail -n 1 | tr -d '=' | sed 's/^ *//;s/ *$//')"
  echo "- wall **${wall} s**; CPU ${user} s user + ${sys} s system (every worker and command together)"
  echo
  echo '```'
  awk '/slowest 15 durations/ {on = 1; next} on && /^=/ {exit} on && /^[0-9]/' "$log"
  echo '```'
} >"$record"
if $cold; then rm -rf "$SPECEXP_CACHE" "$TORCHINDUCTOR_CACHE_DIR"; fi
rm -f "$log" "$log.time"
cat "$record"
echo "record: $record"
exit $status
