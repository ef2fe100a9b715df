#!/usr/bin/env bash
# Issue 11 on CPU (docs/results/cpu-itl.md): a tune under a p99 ITL SLO where prefill stalls bind, to show
# where the budget goes (the chunk ladder first, configs the measured prefill speed rules out skipped with
# the reason), each level decided by its statistical test, and the head-to-head of the pick against the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/cpu-itl}
.venv/bin/servetune tune --model "$PWD/.cache/tiny-llama" --workload docs/results/cpu/chunking.yaml \
  --slo itl_p99_ms=30 --strategy optuna --budget 4 --max-levels 5 "${@:2}" --out "$out"
