#!/usr/bin/env bash
# Issue 11 on CPU (docs/results/cpu-itl.md): a tune under a p99 ITL SLO where prefill stalls bind, to show
# where the budget goes (the chunk ladder first, configs the measured prefill speed rules out skipped with
# the reason) and the pick confirmed against the defaults with bootstrap intervals.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/cpu-itl}
.venv/bin/servetune tune --model "$PWD/.cache/tiny-llama" --workload docs/results/cpu/chunking.yaml \
  --slo itl_p99_ms=30 --strategy optuna --budget 4 --level-seconds 10 --min-level-requests 60 \
  --level-requests 300 --max-levels 5 --confirm-requests 150 --confirm-seeds 3 --out "$out"
