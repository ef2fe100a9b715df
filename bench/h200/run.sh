#!/usr/bin/env bash
# On the lent H200, detached (setsid), from a copy of the project and kit outside the repository tree (/root/w):
# `servetune tune --time-limit $TIME_LIMIT (14m) --budget 4` of a workload under its SLOs, then (unless NO_VERIFY)
# `servetune verify` of the pick with vLLM's own client on 150 prompts.
# usage: run.sh NAME WORKLOAD SLO... ; results under /root/res/NAME, `done` marks the end. Poll with poll.sh.
source "$(dirname "$0")/common.sh" "$@"
tune 4 "${TIME_LIMIT:-14m}"
date +%s > "$res/t1"
[ -n "${NO_VERIFY:-}" ] || python3 -m servetune verify --out "$res/tune" --num-prompts 150 --json "$res/verify/verify.json" > "$res/verify.log" 2>&1
echo "verify rc=$?" >> "$res/verify.log"
date +%s > "$res/t2"
touch "$res/done"
