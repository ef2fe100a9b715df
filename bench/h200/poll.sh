#!/usr/bin/env bash
# Poll the detached run NAME for up to $2 seconds (less when it is done), archive /root/res into $OUT, show where
# it stands.
name=$1
for ((i = 0; i < ${2:-500}; i += 5)); do [ -f "/root/res/$name/done" ] && break; sleep 5; done
tar -C /root -czf "$OUT/res.tgz" --exclude='*.records.jsonl' res 2>/dev/null
tar -C /root -cJf "$OUT/records.tar.xz" res 2>/dev/null
cp "/root/res/$name/tune.log" "/root/res/$name/verify.log" "$OUT/" 2>/dev/null
date; tail -c 3500 "/root/res/$name/tune.log"; [ -f "/root/res/$name/verify.log" ] && tail -c 2500 "/root/res/$name/verify.log"
nvidia-smi --query-gpu=memory.used --format=csv,noheader; pgrep -fa "vllm|servetune" | cut -c1-150 | head -5
