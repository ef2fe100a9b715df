#!/usr/bin/env bash
# On the lent H200, from a copy of the project outside the repository tree (after
# `source .gpu/kit/device-install.sh`): a tune of RAG-like traffic under p99 ITL and TTFT SLOs with
# confirmation, then the defaults and the pick re-measured with `vllm bench serve` at the pick's rate.
# Writes everything under $1 (default /root/slo). Run detached (setsid) and poll: see docs/results/h200-slo.md.
set -u
res=${1:-/root/slo}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
m=$SERVETUNE_GPU_MODEL
date +%s > "$res/t0"
python3 -m servetune tune --model "$m" --workload docs/results/h200-slo/rag.yaml \
  --slo itl_p99_ms=50 --slo ttft_p99_ms=2000 --strategy optuna --budget 3 --engine-arg load-format=dummy \
  --level-seconds 10 --level-requests 200 --min-level-requests 40 --max-levels 4 \
  --confirm-requests 100 --confirm-seeds 3 --out "$res/rag" > "$res/rag.log" 2>&1
date +%s > "$res/t1"
python3 docs/results/h200-slo/side_by_side.py "$res/rag" "$m" "$res/rag-vllm" 200 > "$res/side.log" 2>&1
date +%s > "$res/t2"
touch "$res/done"
