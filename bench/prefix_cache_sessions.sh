#!/usr/bin/env bash
# The multi-turn example tuned with prefix caching on and off (vLLM's defaults otherwise): goodput under
# p99 TTFT <= ${SLO_MS:-100} ms, one launch each, no confirmation. Writes out/prefix-cache-{on,off}/.
set -euo pipefail
cd "$(dirname "$0")/.."
for mode in on off; do
    flag=$([ "$mode" = on ] && echo true || echo false)
    flock /tmp/servetune-cpu.lock .venv/bin/servetune tune --model .cache/tiny-llama --workload examples/multi-turn.yaml \
        --slo "ttft_p99_ms=${SLO_MS:-100}" --budget 1 --no-confirm --engine-arg "enable-prefix-caching=$flag" \
        --out "out/prefix-cache-$mode"
done
for mode in on off; do
    python3 - "out/prefix-cache-$mode/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
d = s["default"]
print(sys.argv[1], {k: d.get(k) for k in ("goodput_rate", "goodput_bracket", "request_throughput", "p99_ttft_ms")})
PY
done
