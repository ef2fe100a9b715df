#!/usr/bin/env bash
# On the lent H200, detached (setsid), from a copy of the project and kit outside the repository tree:
# `servetune tune --time-limit 20m` on the chat-like workload under p99 TPOT <= 12 ms and p99 TTFT <= 1 s
# (budget 3: vLLM's defaults and two searched configs), then `servetune verify` of its pick with vLLM's own
# client on the same 300 prompts. Results under $1 (default /root/res); `done` marks the end.
set -u
res=${1:-/root/res}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1 COLUMNS=160
m=$SERVETUNE_GPU_MODEL
date +%s > "$res/t0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$res/gpu.txt" 2>&1
python3 -m servetune tune --model "$m" --workload docs/results/h200-slo/chat.yaml \
  --slo tpot_p99_ms=12 --slo ttft_p99_ms=1000 --strategy optuna --budget 3 --engine-arg load-format=dummy \
  --time-limit 20m --out "$res/tune" > "$res/tune.log" 2>&1
echo "tune rc=$?" >> "$res/tune.log"
date +%s > "$res/t1"
python3 -m servetune verify --out "$res/tune" --num-prompts 300 --json "$res/verify/verify.json" \
  > "$res/verify.log" 2>&1
echo "verify rc=$?" >> "$res/verify.log"
date +%s > "$res/t2"
touch "$res/done"
