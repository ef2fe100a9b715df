#!/usr/bin/env bash
# On the lent H200, detached (setsid), from a copy of the project and kit outside the repository tree (/root/w): a
# `servetune tune --time-limit $TIME_LIMIT (15m) --budget $BUDGET (3)` of a workload under its SLOs, then vLLM's own
# client on vLLM's defaults over long steady levels (`bench/goodput_truth.py`, $SECONDS_PER_RATE s of arrivals each) at
# 0.95x and 1/0.85x the goodput rate the tune measured for them: the first holds and the second does not when the
# tune's rate is within -15% / +5% of the rate vLLM's client sustains. With RATE set, no tune: that rate is the one
# held against vLLM's client (a tune's, measured before).
# usage: [RATE=R] truth.sh NAME WORKLOAD SLO... ; results under /root/res/NAME, `done` marks the end. Poll with poll.sh.
source "$(dirname "$0")/common.sh" "$@"
rate=${RATE:-}
if [ -z "$rate" ]; then
  tune "${BUDGET:-3}" "${TIME_LIMIT:-15m}"
  rate=$(python3 -c "import json; print(json.load(open('$res/tune/summary.json'))['default']['goodput_rate'] or '')")
fi
date +%s > "$res/t1"
echo "load-format: dummy" > "$res/dummy.yaml"
if [ -n "$rate" ]; then
  rates=$(python3 -c "print(round(0.95 * $rate, 3), round($rate / 0.85, 3))")
  python3 bench/goodput_truth.py --model "$SERVETUNE_GPU_MODEL" --workload "$workload" --config "$res/dummy.yaml" \
    "${slos[@]}" --rates $rates --seconds "${SECONDS_PER_RATE:-150}" --out "$res/truth" > "$res/truth.log" 2>&1
  echo "truth rc=$?" >> "$res/truth.log"
fi
date +%s > "$res/t2"
touch "$res/done"
