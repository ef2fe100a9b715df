#!/usr/bin/env bash
# On the lent 2 x H200 machine (after `source .gpu/kit/device-install.sh`): the same tune twice, with the same
# budget, first two trials at a time (--parallel 2, one GPU each), then one at a time. The parallel run goes
# first, so it pays for the cold compile caches. Writes under $1 (default /root/x2). Run detached and poll.
set -u
res=${1:-/root/x2}; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH
here=docs/results/h200x2
nvidia-smi -L > "$res/gpus.txt"
tune() {  # tune NAME [EXTRA ...]
  local name=$1; shift
  date +%s > "$res/$name.t0"
  python3 -m servetune tune --model "$SERVETUNE_GPU_MODEL" --workload $here/chat.yaml \
     --slo ttft_p99_ms=1000 --slo tpot_p99_ms=40 --strategy optuna --budget 4 --engine-arg load-format=dummy \
     --level-seconds 8 --level-requests 300 --min-level-requests 60 --max-levels 2 --out "$res/$name" "$@" \
     > "$res/$name.log" 2>&1
  date +%s > "$res/$name.t1"
  python3 $here/timeline.py "$res/$name" > "$res/$name/timeline.json"
}
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 5 > "$res/gpu_usage.csv" &
tune parallel --parallel 2
tune sequential
kill %1
touch "$res/done"
