#!/usr/bin/env bash
# The CPU "tune beats the default" experiment (docs/results/cpu.md): an optuna tune with budget 6, then the
# default config's goodput rate measured 3 more times (budget 1 each) for the run-to-run noise.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/cpu}
common=(--model "$PWD/.cache/tiny-llama" --workload docs/results/cpu/chunking.yaml --slo tpot_p99_ms=25
        --max-levels 5)
.venv/bin/servetune tune "${common[@]}" --strategy optuna --budget 6 --out "$out/optuna"
for k in 1 2 3; do
  .venv/bin/servetune tune "${common[@]}" --budget 1 --out "$out/noise-$k"
done
.venv/bin/python - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
s = json.loads((out / "optuna/summary.json").read_text())
print("default", s["default"]["goodput_rate"], s["default"]["goodput_bracket"])
print("best   ", s["best"]["goodput_rate"], s["best"]["goodput_bracket"], s["best"]["config"])
for k in (1, 2, 3):
    n = json.loads((out / f"noise-{k}/summary.json").read_text())["default"]
    print(f"noise-{k}", n["goodput_rate"], n["goodput_bracket"])
PY
