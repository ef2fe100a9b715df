"""How many launches the memory model saves a `seed` tune: the procedure's ladder configs for a workload,
predicted against a device, without launching anything.

Usage: python bench/memory_skips.py MODEL_DIR WORKLOAD.yaml [--device-gib 143771/1024 ...]
Prints, per device, the ladder configs and which the memory model rules out (and why).
"""

import argparse

from servetune.engine.installed import InstalledVllm
from servetune.engine.memory import Device, ModelShape
from servetune.search.feasibility import MemoryCheck
from servetune.search.space import build_space
from servetune.search.strategies import SeedStrategy
from servetune.workload import load_workload

GPU_FLAGS = ("max_num_batched_tokens", "max_model_len", "max_num_seqs", "gpu_memory_utilization",
             "enable_chunked_prefill", "enable_prefix_caching", "enforce_eager")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("workload")
    parser.add_argument("--device-gib", type=float, nargs="+", default=[143771 / 1024, 24.0, 48.0])
    args = parser.parse_args()
    spec = load_workload(args.workload)
    longest = int(spec.input_len.model_dump().get("max") or spec.input_len.low) + int(
        spec.output_len.model_dump().get("max") or spec.output_len.low)
    vllm = InstalledVllm("0.24.0", "cuda", {f: {"kind": "value"} for f in GPU_FLAGS})
    shape = ModelShape.from_path(args.model)
    for gib in args.device_gib:
        device = Device.from_gib(gib, name="NVIDIA H200" if gib > 140 else "")
        space = build_space(vllm, longest)
        memory = MemoryCheck(shape, device)
        steps = [{**space.fixed, **step} for _, ladder in SeedStrategy(space, 99, 0, False).steps for step in ladder]
        ruled_out = []
        for config in steps:
            if "gpu_memory_utilization" not in config:
                config["gpu_memory_utilization"] = memory.gpu_memory_utilization(config)
            util = config["gpu_memory_utilization"]
            reason = space.violation(config) or (memory.misfit(config) if util else "no gpu-memory-utilization fits")
            if reason:
                ruled_out.append((config, reason))
        print(f"{gib:.1f} GiB: {len(ruled_out)} of {len(steps)} ladder configs ruled out before launch")
        for config, reason in ruled_out:
            short = {k: v for k, v in config.items() if k != "max_model_len"}
            print(f"  {short}: {reason[:110]}")


if __name__ == "__main__":
    main()
