#!/bin/bash
# One `servetune verify` run of the long-reply workload on vLLM's defaults, the threads of both clients and of the
# server's processes sampled (bench/client_threads.py):
#   docs/results/verify-clients/run.sh NAME [more verify options]   (from the repository root; PY: the Python;
#   VERIFY: what runs verify, default `-m servetune`, e.g. docs/results/verify-clients/aba.py)
set -eu
OUT=docs/results/verify-clients/$1
shift
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
"$PY" bench/client_threads.py 'vllm.benchmarks import serve' "$OUT/vllm-client.threads.jsonl" --dump-after 40 \
    --gone 600 &
"$PY" bench/client_threads.py 'verify --config docs/results/verify-clients/defaults.yaml' \
    "$OUT/servetune.threads.jsonl" --gone 5 &
"$PY" bench/client_threads.py 'vllm.entrypoints.openai.api_server' "$OUT/api-server.threads.jsonl" &
PYTHONPATH=src "$PY" ${VERIFY:--m servetune} verify --config docs/results/verify-clients/defaults.yaml \
    --model .cache/tiny-llama --workload docs/results/verify-clients/longreply.yaml --rate 8.72 --num-prompts 600 \
    --slo ttft_p99_ms=2000 --slo tpot_p99_ms=150 --json "$OUT/verify.json" "$@" 2>&1 | tee "$OUT/verify.log"
wait
