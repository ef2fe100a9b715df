#!/usr/bin/env bash
# On the lent H200 (after `source kit/device-install.sh`, from a copy of the project outside the repository
# tree): the RAG-like workload of run.sh under a p99 ITL SLO of 30 ms, where the defaults' prefill stalls
# bind (their pooled p99 ITL was 36.6 ms at 5.7 req/s in run.sh's confirmation). Budget 2 (the defaults and
# the ladder's first rung), confirmation at the size: 3 arrival orders x 300 requests per rate.
# Then, if the device time allows (started within SIDE_BY_SIDE_BY s), both configs re-measured with
# `vllm bench serve` at the pick's confirmed rate. Writes under $1 (default /root/itl30).
set -u
res=${1:-/root/itl30}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
m=$SERVETUNE_GPU_MODEL
t0=$(date +%s); echo "$t0" > "$res/t0"
python3 -m servetune tune --model "$m" --workload docs/results/h200-slo/rag.yaml \
  --slo itl_p99_ms=30 --slo ttft_p99_ms=2000 --strategy optuna --budget 2 --engine-arg load-format=dummy \
  --level-seconds 10 --level-requests 200 --min-level-requests 40 --max-levels 4 \
  --confirm-requests 300 --confirm-seeds 3 --out "$res/rag" > "$res/rag.log" 2>&1
date +%s > "$res/t1"
if [ $(( $(date +%s) - t0 )) -lt "${SIDE_BY_SIDE_BY:-1150}" ]; then
  python3 docs/results/h200-slo/side_by_side.py "$res/rag" "$m" "$res/rag-vllm" 200 > "$res/side.log" 2>&1
fi
date +%s > "$res/t2"
touch "$res/done"
