#!/usr/bin/env bash
# On the lent H200 (after `source .gpu/kit/device-install.sh`): the anchor bench, then the tune.
# Writes everything under $1 (default /root/h200). Run detached (setsid) and poll: see docs/results/h200.md.
set -u
res=${1:-/root/h200}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH
m=$SERVETUNE_GPU_MODEL
st() { python3 -m servetune "$@"; }
date +%s > "$res/t0"
st bench --launch --model "$m" --engine-arg load-format=dummy --input-len 1024 --output-len 256 \
   --num-prompts 1000 --request-rate inf --seed 0 --json "$res/anchor.json" > "$res/anchor.log" 2>&1
date +%s > "$res/t1"
st tune --model "$m" --workload docs/results/h200/chat.yaml --slo ttft_p99_ms=1000 --slo tpot_p99_ms=40 \
   --strategy optuna --budget 5 --engine-arg load-format=dummy \
   --reference-config docs/results/h200/ref-prefix-caching.yaml --reference-config docs/results/h200/ref-chunked-256.yaml \
   --level-seconds 15 --level-requests 600 --min-level-requests 100 --max-levels 4 --out "$res/tune" > "$res/tune.log" 2>&1
date +%s > "$res/t2"
touch "$res/done"
