#!/usr/bin/env bash
# On the lent H200, detached (setsid), from a copy of the project and kit outside the repository tree (/root/w):
# `servetune tune --time-limit $TIME_LIMIT (14m) --budget 4` of a workload under its SLOs, then (unless NO_VERIFY)
# `servetune verify` of the pick with vLLM's own client on 150 prompts.
# usage: run.sh NAME WORKLOAD SLO... ; results under /root/res/NAME, `done` marks the end. Poll with poll.sh.
set -u
name=$1 workload=$2; shift 2
res=/root/res/$name; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1 COLUMNS=160
slos=(); for s in "$@"; do slos+=(--slo "$s"); done
date +%s > "$res/t0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$res/gpu.txt" 2>&1
python3 -m servetune tune --model "$SERVETUNE_GPU_MODEL" --workload "$workload" "${slos[@]}" --strategy optuna \
  --budget 4 --engine-arg load-format=dummy --time-limit "${TIME_LIMIT:-14m}" --out "$res/tune" > "$res/tune.log" 2>&1
echo "tune rc=$?" >> "$res/tune.log"
date +%s > "$res/t1"
[ -n "${NO_VERIFY:-}" ] || python3 -m servetune verify --out "$res/tune" --num-prompts 150 --json "$res/verify/verify.json" > "$res/verify.log" 2>&1
echo "verify rc=$?" >> "$res/verify.log"
date +%s > "$res/t2"
touch "$res/done"
