#!/usr/bin/env bash
# Issue 27, item 2 (docs/results/search-vs-grid.md): on one machine, in one run, per workload:
#   1. a grid: every chunk size of CHUNKS x every max-num-seqs of SEQS, each a one-config tune (its knobs fixed with
#      --engine-arg, --budget 1 --no-confirm) with the full rate search;
#   2. the default strategy (optuna, its default budget, the head-to-head) with no time limit;
#   3. the default strategy with a time limit of 30% of the grid's wall time;
# then, per workload, the grid's best config and each arm's recommendation re-measured back to back (one-config
# tunes: the machine's speed drifts over the tens of minutes between the arms). `--recheck` runs only that stage;
# `--searches` runs stages 2, 3 and the re-measurement against the grid already in OUT (after a change to the search);
# `--rounds K` re-measures the same configs K more times (arms round1-*, round2-*, ...), the order rotated each round
# so that a drift is shared out.
# Every arm uses the same level options (LEVEL_OPTS). Wall times go to $OUT/times.tsv; summarise with
# `python bench/search_vs_grid.py $OUT`.
# usage: bench/search_vs_grid.sh [--recheck | --searches | --rounds K] OUT NAME WORKLOAD SLO [NAME WORKLOAD SLO ...]
set -uo pipefail
cd "$(dirname "$0")/.."
recheck_only= searches_only= rounds=0
case $1 in
  --recheck) recheck_only=1; shift ;;
  --searches) searches_only=1; shift ;;
  --rounds) recheck_only=1 rounds=$2; shift 2 ;;
esac
out=$1; shift
st=(.venv/bin/servetune tune --model "$PWD/.cache/tiny-llama")
CHUNKS=${CHUNKS:-128 256 512 1024} SEQS=${SEQS:-16 128}
LEVEL_OPTS=(--level-requests 300 --max-levels 5)
mkdir -p "$out"
timed() {  # NAME ARM DIR CMD...: runs CMD, appends "name arm seconds rc" to times.tsv
  local name=$1 arm=$2 dir=$3; shift 3
  local t0; t0=$(date +%s.%N)
  "$@" --out "$dir" > "$dir.log" 2>&1; local rc=$?
  printf '%s\t%s\t%.1f\t%s\n' "$name" "$arm" "$(echo "$(date +%s.%N) - $t0" | bc)" "$rc" >> "$out/times.tsv"
}
recheck() {  # NAME WORKLOAD SLO [ROUND]: each of $picks once, as recheck-* (or roundROUND-*, the order rotated)
  local stage=recheck line arm args k
  [ -n "${4:-}" ] && stage=round$4
  for ((k = 0; k < ${#picks[@]}; k++)); do
    line=${picks[(k + ${4:-1} - 1) % ${#picks[@]}]}; arm=${line%%$'\t'*}; read -ra args <<< "${line#*$'\t'}"
    timed "$1" "$stage-$arm" "$out/$1/$stage-$arm" "${st[@]}" --workload "$2" --slo "$3" "${LEVEL_OPTS[@]}" \
      "${args[@]/#/--engine-arg=}" --budget 1 --no-confirm
  done
}
workloads=("$@")
while (($# >= 3)); do
  name=$1 workload=$2 slo=$3; shift 3
  [ -n "$recheck_only" ] && continue
  mkdir -p "$out/$name"
  [ -n "$searches_only" ] || for c in $CHUNKS; do for s in $SEQS; do
    timed "$name" "grid-$c-$s" "$out/$name/grid-$c-$s" "${st[@]}" --workload "$workload" --slo "$slo" "${LEVEL_OPTS[@]}" \
      --engine-arg max-num-batched-tokens="$c" --engine-arg max-num-seqs="$s" --budget 1 --no-confirm
  done; done
  grid_s=$(awk -v n="$name" '$1 == n && $2 ~ /^grid-/ {s += $3} END {printf "%d", s}' "$out/times.tsv")
  timed "$name" search "$out/$name/search" "${st[@]}" --workload "$workload" --slo "$slo" "${LEVEL_OPTS[@]}"
  timed "$name" search-30pct "$out/$name/search-30pct" "${st[@]}" --workload "$workload" --slo "$slo" \
    "${LEVEL_OPTS[@]}" --time-limit "$((grid_s * 3 / 10))s"
done
for ((i = 0; i + 2 < ${#workloads[@]}; i += 3)); do
  mapfile -t picks < <(.venv/bin/python bench/search_vs_grid.py "$out" --picks "${workloads[i]}")
  if ((rounds)); then for ((r = 1; r <= rounds; r++)); do recheck "${workloads[@]:i:3}" "$r"; done
  else recheck "${workloads[@]:i:3}"; fi
done
