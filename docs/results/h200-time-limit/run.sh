#!/usr/bin/env bash
# On the lent H200, detached (setsid), from a copy of the project and kit outside the repository tree (the
# tree is synced again by every call): `servetune tune --time-limit 20m` on the RAG-like workload under
# p99 ITL <= 30 ms and p99 TTFT <= 2 s, then `servetune verify` of its pick with vLLM's own client on the
# same prompts. Results under $1 (default /root/res); `done` marks the end.
set -u
res=${1:-/root/res}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1 COLUMNS=160
m=$SERVETUNE_GPU_MODEL
date +%s > "$res/t0"
python3 -m servetune tune --model "$m" --workload docs/results/h200-slo/rag.yaml \
  --slo itl_p99_ms=30 --slo ttft_p99_ms=2000 --strategy optuna --budget 3 --engine-arg load-format=dummy \
  --time-limit 20m --out "$res/tune" > "$res/tune.log" 2>&1
echo "tune rc=$?" >> "$res/tune.log"
date +%s > "$res/t1"
python3 -m servetune verify --out "$res/tune" --num-prompts "${VERIFY_PROMPTS:-200}" --json "$res/verify.json" \
  > "$res/verify.log" 2>&1
echo "verify rc=$?" >> "$res/verify.log"
date +%s > "$res/t2"
touch "$res/done"
