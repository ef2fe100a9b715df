#!/usr/bin/env bash
# servetune's goodput of vLLM's defaults beside the rate vLLM's own client sustains (`bench/goodput_truth.py`): a
# tune of the defaults alone (`--budget 1`, no time limit, so its search ends by itself), then vLLM's client over
# long steady levels at 0.95x and 1/0.85x servetune's rate: the first holds and the second does not when servetune's
# rate is within -15% / +5% of the truth. Each step's files under OUT; `SECONDS_PER_RATE` (default 180) of arrivals
# per level of vLLM's client. With CONFIG (a vLLM config YAML) that config in place of the defaults, in both.
# usage: [CONFIG=FILE] bench/goodput_truth.sh OUT WORKLOAD SLO... (e.g. ttft_p99_ms=2000 tpot_p99_ms=150)
set -euo pipefail
out=$1 workload=$2; shift 2
slos=(); for s in "$@"; do slos+=(--slo "$s"); done
tune_config=() truth_config=()
[ -z "${CONFIG:-}" ] || { tune_config=(--engine-arg "config=$CONFIG"); truth_config=(--config "$CONFIG"); }
py=${PY:-.venv/bin/python}
mkdir -p "$out"
$py -m servetune tune --model .cache/tiny-llama --workload "$workload" "${slos[@]}" "${tune_config[@]}" --budget 1 --out "$out/tune" \
  2>&1 | tee "$out/tune.log"
rate=$($py -c "import json; print(json.load(open('$out/tune/summary.json'))['default']['goodput_rate'] or '')")
[ -n "$rate" ] || { echo "the tune holds no rate: nothing to hold against vLLM's client"; exit 1; }
rates=$($py -c "print(round(0.95 * $rate, 3), round($rate / 0.85, 3))")
$py bench/goodput_truth.py --model .cache/tiny-llama --workload "$workload" "${truth_config[@]}" "${slos[@]}" --rates $rates \
  --seconds "${SECONDS_PER_RATE:-180}" --out "$out/truth" 2>&1 | tee "$out/truth.log"
