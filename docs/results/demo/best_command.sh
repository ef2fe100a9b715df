#!/bin/sh
# servetune: the best config found
exec vllm serve /tmp/st-demo/out/demo/tiny-llama --max-num-batched-tokens 512 --enable-chunked-prefill --enable-prefix-caching --max-num-seqs 128 --no-enforce-eager --kv-cache-memory-bytes 1073741824
