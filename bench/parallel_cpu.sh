#!/usr/bin/env bash
# Wall time of the same tune (budget 4, optuna) one trial at a time and with --parallel 2 on this CPU host
# (docs/results/parallel.md). With --parallel 2 each trial owns half of the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/parallel-cpu}
rm -rf "$out"; mkdir -p "$out"
common=(--model "$PWD/.cache/tiny-llama" --workload docs/results/cpu/chunking.yaml --slo tpot_p99_ms=25
        --strategy optuna --budget 4 --max-levels 2)
for mode in sequential parallel; do
  extra=(); [ $mode = parallel ] && extra=(--parallel 2)
  start=$(date +%s.%N)
  .venv/bin/servetune tune "${common[@]}" "${extra[@]}" --out "$out/$mode" > "$out/$mode.log" 2>&1
  echo "$mode: $(echo "$(date +%s.%N) - $start" | bc) s"
done
.venv/bin/python - "$out" <<'PY'
import json, sys, pathlib
for mode in ("sequential", "parallel"):
    s = json.loads((pathlib.Path(sys.argv[1]) / mode / "summary.json").read_text())
    print(mode, "default", round(s["default"]["goodput_rate"], 2), "best", round(s["best"]["goodput_rate"], 2),
          s["best"]["config"])
PY
