#!/bin/bash
# What is committed of each run (from the repository root): vLLM's client JSONs without `generated_texts` and `itls`
# (its summary keeps the ITL statistics), the bulky files gzipped, one copy of the dataset (the same in every run).
set -eu
cd docs/results/verify-clients
for f in */verify*vllm-bench.json; do
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); [d.pop(k, None) for k in ('generated_texts', 'itls')]; json.dump(d, open(sys.argv[1], 'w'))" "$f"
done
for d in */; do
    [ "$d" = base1/ ] || rm -f "$d/verify.requests.jsonl"
done
gzip -9 */*.jsonl */verify*vllm-bench.json */verify.server.log
