"""On a one-GPU machine: a tune whose trials run in the local worker pool (one slot), the path `--parallel N`
takes on N GPUs: the probe's GPU count, a spawned worker given CUDA_VISIBLE_DEVICES, a real vLLM trial in it.

Usage (after `source .gpu/kit/device-install.sh`): python3 docs/results/parallel/gpu_pool_check.py OUT
"""

import json
import sys
import time
from pathlib import Path

from servetune.engine import probe
from servetune.executors.local import LocalPool
from servetune.trial import LevelOptions
from servetune.tune import TuneOptions, tune
from servetune.workload import load_workload

if __name__ == "__main__":  # spawned workers import this file too
    out = Path(sys.argv[1])
    vllm = probe()
    print("vLLM", vllm.version, vllm.device_type, vllm.device_name, "GPUs:", vllm.device_count, flush=True)
    opts = TuneOptions(model=str(Path(__import__("os").environ["SERVETUNE_GPU_MODEL"]).resolve()),
                       workload=load_workload(Path("docs/results/h200x2/chat.yaml")), out=out,
                       slo={"ttft_p99_ms": 1000.0, "tpot_p99_ms": 40.0}, strategy="optuna", budget=2,
                       engine_args={"load_format": "dummy"},
                       levels=LevelOptions(seconds=8, requests=300, min_requests=60, max_levels=2))
    started = time.monotonic()
    summary = tune(opts, executor=LocalPool(1, vllm))
    print(json.dumps({"wall_s": round(time.monotonic() - started, 1), **summary}, indent=1, default=str))
