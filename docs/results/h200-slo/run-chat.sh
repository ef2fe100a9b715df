#!/usr/bin/env bash
# On the lent H200, from a copy of the project outside the repository tree (after `source kit/device-install.sh`):
# the chat-like workload chat.yaml under p99 TPOT <= 12 ms (the defaults' p99 TPOT crossed 12 ms between
# 17.0 and 18.8 req/s in h200/tune/levels.csv) and a loose p99 TTFT <= 1000 ms. Budget 3 (the defaults and
# the chunk ladder's first two rungs: a TPOT SLO puts the ladder first), confirmation at the issue's size
# (3 arrival orders x 300 requests per rate), then the defaults and the pick re-measured side by side with
# `vllm bench serve` at the pick's confirmed rate. Then, only if the device time allows (the epoch second in
# /root/h2h_deadline, written by the polling calls from the lease's time left, is still ahead), the ITL-30
# run's missing head-to-head (itl30/head-to-head.py: the defaults on rag.yaml at 9.31 req/s).
# Writes under $1 (default /root/chat), then packs it into $1.small.tar.gz and $1.records.tar.xz.
set -u
res=${1:-/root/chat}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
m=$SERVETUNE_GPU_MODEL
t0=$(date +%s); echo "$t0" > "$res/t0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$res/gpu.txt" 2>&1
python3 -m servetune tune --model "$m" --workload docs/results/h200-slo/chat.yaml \
  --slo tpot_p99_ms=12 --slo ttft_p99_ms=1000 --strategy optuna --budget 3 --engine-arg load-format=dummy \
  --level-seconds 12 --level-requests 250 --min-level-requests 40 --max-levels 4 \
  --confirm-requests 300 --confirm-seeds 3 --out "$res/tune" > "$res/chat.log" 2>&1
echo "tune rc $?" >> "$res/chat.log"; date +%s > "$res/t1"
python3 docs/results/h200-slo/side_by_side.py "$res/tune" "$m" "$res/vllm" 200 > "$res/side.log" 2>&1
echo "side rc $?" >> "$res/side.log"; date +%s > "$res/t2"
if [ "$(date +%s)" -lt "$(cat /root/h2h_deadline 2>/dev/null || echo 0)" ]; then
  python3 docs/results/h200-slo/itl30/head-to-head.py "$m" "$res/h2h" > "$res/h2h.log" 2>&1
  echo "h2h rc $?" >> "$res/h2h.log"
fi
date +%s > "$res/t3"
cd "$(dirname "$res")" && b=$(basename "$res") \
  && tar --exclude='*.records.jsonl' -czf "$res.small.tar.gz" "$b" \
  && find "$b" -name '*.records.jsonl' | tar -cf - -T - | xz -T0 -6 > "$res.records.tar.xz"
touch "$res/done"
