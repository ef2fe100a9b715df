#!/usr/bin/env bash
# Poll the detached run for up to $1 seconds (it ends sooner when the run is done), then archive /root/res
# into $OUT and show where the run stands.
for ((i = 0; i < ${1:-500}; i += 5)); do [ -f /root/res/done ] && break; sleep 5; done
tar -C /root -czf "$OUT/res.tgz" res 2>/dev/null
cp /root/res/tune.log /root/res/verify.log "$OUT/" 2>/dev/null
date; tail -c 3000 /root/res/tune.log; [ -f /root/res/verify.log ] && tail -c 2500 /root/res/verify.log
ls /root/res; nvidia-smi --query-gpu=memory.used --format=csv,noheader; pgrep -fa "vllm|servetune" | cut -c1-150 | head -5
