#!/usr/bin/env bash
# Poll the detached run NAME for up to $2 seconds (less when it is done), archive /root/res into $OUT (the summaries;
# servetune's records; vLLM's client's detailed results; gzip: xz took minutes of a poll), show where it stands.
name=$1
for ((i = 0; i < ${2:-500}; i += 5)); do [ -f "/root/res/$name/done" ] && break; sleep 5; done
tar -C /root -czf "$OUT/res.tgz" --exclude='*.records.jsonl' --exclude='*.vllm-bench.json' --exclude='*.requests.jsonl' res 2>/dev/null
(cd /root && find res -name '*.records.jsonl' | tar -czf "$OUT/records.tgz" -T -) 2>/dev/null
(cd /root && find res -name '*.vllm-bench.json' | tar -czf "$OUT/vllm.tgz" -T -) 2>/dev/null
cp "/root/res/$name/tune.log" "/root/res/$name/verify.log" "/root/res/$name/truth.log" "$OUT/" 2>/dev/null
date; tail -c 3000 "/root/res/$name/tune.log"
for log in verify truth; do [ -f "/root/res/$name/$log.log" ] && tail -c 2000 "/root/res/$name/$log.log"; done
nvidia-smi --query-gpu=memory.used --format=csv,noheader; pgrep -fa "vllm|servetune" | cut -c1-150 | head -5
