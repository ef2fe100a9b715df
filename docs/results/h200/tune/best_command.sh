#!/bin/sh
# servetune: the best config found
exec vllm serve /work/main/.gpu/kit/llama3-8b-shape --load-format dummy
