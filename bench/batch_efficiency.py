"""What asking for several configs at once costs the search: the real tuner loop (TPE, constant liar,
anchor, skip rules) over the real GPU search space, on a synthetic goodput landscape, for batch sizes
1, 2, 4 and 8 at the same budget. Nothing is launched: trials finish at once with the landscape's value
(plus noise), and a batch of `k` configs is asked before any of them is told, like `--parallel k`.

The landscape is made up (peaks at chunked prefill 2048, 256 seqs, CUDA graphs on, 0.9 utilization), so
the numbers say how batching changes the search, not what vLLM does.

Usage: python bench/batch_efficiency.py MODEL_DIR [--budget 12] [--seeds 20]
Prints, per batch size, the mean (and standard error, 10th percentile) over seeds of the share of the
landscape's best value that the study's best config reaches.
"""

import argparse
import itertools
import math
import random
import statistics
import tempfile
from concurrent.futures import Future
from pathlib import Path

from servetune.engine.installed import InstalledVllm
from servetune.executors import Job
from servetune.measure.metrics import LevelMetrics
from servetune.measure.slo import parse_slo
from servetune.search.space import build_space
from servetune.study.outcome import LevelOutcome, TrialOutcome
from servetune.trial.run import LevelOptions
from servetune.tuner.loop import TuneOptions, tune
from servetune.workload import WorkloadSpec

GPU_FLAGS = ("max_num_batched_tokens", "max_model_len", "max_num_seqs", "gpu_memory_utilization",
             "enable_chunked_prefill", "enable_prefix_caching", "enforce_eager")
VLLM = InstalledVllm("0.24.0", "cuda", {f: {"kind": "value"} for f in GPU_FLAGS}, device_count=8)
WORKLOAD = WorkloadSpec.model_validate({"num_requests": 20, "input_len": {"type": "fixed", "value": 900},
                                        "output_len": {"type": "fixed", "value": 100}})


def landscape(config: dict) -> float:
    """Synthetic goodput (req/s) of a config; a knob left out has vLLM's H200 default (8192 tokens, 1024
    seqs, chunked prefill and prefix caching on, CUDA graphs, 0.9 utilization)."""
    tokens = config.get("max_num_batched_tokens") or 8192
    chunked = config.get("enable_chunked_prefill", True)
    value = 20 * math.exp(-0.5 * (math.log2(tokens / 2048) / (1.2 if chunked else 0.8)) ** 2)
    value *= 1.0 if chunked else 0.85
    value *= math.exp(-0.5 * (math.log2((config.get("max_num_seqs") or 1024) / 256) / 1.5) ** 2)
    value *= 0.6 if config.get("enforce_eager") else 1.0
    value *= {0.85: 0.93, 0.9: 1.0, 0.95: 0.97}.get(config.get("gpu_memory_utilization", 0.9), 1.0)
    return value * (0.97 if config.get("enable_prefix_caching") is False else 1.0)


class Simulated:
    """Finishes every job as it is submitted; the tuner asks `slots` configs before it tells any."""

    def __init__(self, slots: int, seed: int):
        self.slots, self.rng = slots, random.Random(seed)

    def probe(self) -> InstalledVllm:
        return VLLM

    def misfit(self, job: Job) -> None:
        return None

    def submit(self, job: Job) -> Future:
        rate = landscape(job.config) * (1 + self.rng.gauss(0, 0.03))
        metrics = {name: 0 for name in LevelMetrics.model_fields} | {
            "errors": {}, "client_lagging": False, "stopped_early": False, "per_turn": None, "p99_ttft_ms": 100.0,
            "p99_tpot_ms": 10.0, "request_throughput": rate}
        capacity = LevelOutcome(name="capacity", rate=math.inf, seed=0, verdict="pass", passed=True, reasons=[],
                                metrics=LevelMetrics(**metrics), server=None, records="", rejected=0, attempts=1)
        future: Future = Future()
        future.set_result(TrialOutcome(
            status="ok", config=job.config, levels=[capacity], goodput_rate=rate, goodput_bracket=(rate, rate * 1.05),
            request_throughput=rate, p99_ttft_ms=100.0, p99_tpot_ms=10.0, preemptions=0))
        return future

    def close(self) -> None:
        pass


def best_possible() -> float:
    space = build_space(VLLM, 1000)
    return max(landscape(space.config(dict(zip([k.name for k in space.knobs], values))))
               for values in itertools.product(*(k.choices for k in space.knobs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    top = best_possible()
    print(f"landscape best {top:.2f} req/s; budget {args.budget}; {args.seeds} seeds")
    print("batch  rounds  best found: mean share of the landscape's best +- s.e.   p10")
    for batch in (1, 2, 4, 8):
        shares = []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as out:
                opts = TuneOptions(model=args.model, workload=WORKLOAD, out=Path(out),
                                   slo=parse_slo({"tpot_p99_ms": 50}), budget=args.budget,
                                   levels=LevelOptions(requests=20, max_levels=1), seed=seed)
                summary = tune(opts, executor=Simulated(batch, seed))
            shares.append(landscape(summary.best.config) / top)
        se = statistics.stdev(shares) / math.sqrt(len(shares))
        p10 = statistics.quantiles(shares, n=10)[0]
        print(f"{batch:5d}  {math.ceil(args.budget / batch):6d}  {statistics.mean(shares):40.3f} +- {se:.3f}"
              f"  {p10:.3f}")


if __name__ == "__main__":
    main()
