"""The ITL-30 run's missing head-to-head: vLLM's defaults on rag.yaml at the chunk-512 pick's confirmed rate
(9.31 req/s; exactly 9.306185903248894, the rate its runs were sent at), measured as that tune's confirmation measured the pick there: one launch (servetune's launcher,
`--load-format dummy` only), 3 arrival orders x 300 requests, the prefix cache emptied before each run, 8
warm-up requests before the first. The prompt sets and arrival seeds are the pick's own at 9.31 req/s in
that run (the tune's confirmation sets 9, 10, 11: workload seed + 100_000 + k; arrival seeds 0, 1, 2), so the
two configs saw the same requests at the same instants. Pooled by servetune.confirm.rate_result under
p99 ITL <= 30 ms and p99 TTFT <= 2000 ms (95% bootstrap intervals resampling whole requests).

It ran with servetune at commit 234c013, whose confirmation (`ConfirmOptions`, `rate_result`) has since given
way to the head-to-head (`servetune.confirm`): `git checkout 234c013` to run it again.

Usage: python3 head-to-head.py MODEL RESULT_DIR [RATE] [REQUESTS] [FIRST_SET] [WORKLOAD]
"""

import json
import sys
from pathlib import Path

import numpy as np

from servetune.bench import measure_level
from servetune.confirm import ConfirmOptions, rate_result
from servetune.engine import Engine
from servetune.loadgen import Target
from servetune.outcome import LevelOutcome
from servetune.search.objective import level_verdict
from servetune.trial import reset_prefix_cache
from servetune.workload import build_requests, load_tokenizer, load_workload

SLO = {"itl_p99_ms": 30.0, "ttft_p99_ms": 2000.0}
WARMUP = 8  # LevelOptions.warmup_requests
SEEDS = 3


def main(model: str, results: Path, rate: float = 9.306185903248894, count: int = 300, first_set: int = 9,
         workload_path: str = str(Path(__file__).resolve().parent.parent / "rag.yaml")) -> None:
    results.mkdir(parents=True, exist_ok=True)
    workload = load_workload(Path(workload_path))
    tokenizer = load_tokenizer(model)
    sets = [build_requests(workload, tokenizer, seed=workload.seed + 100_000 + first_set + k, count=count + WARMUP)
            for k in range(SEEDS)]
    engine = Engine(model, {"load_format": "dummy"}, results / "server.log")
    startup = engine.start().to_dict()
    levels = []
    try:
        target = Target(engine.base_url, model, workload.endpoint)
        for seed, requests in enumerate(sets):
            warmup = WARMUP if seed == 0 else 0
            reset_prefix_cache(engine.base_url)
            result = measure_level(target, requests[: count + warmup], request_rate=rate,
                                   burstiness=workload.burstiness, warmup_requests=warmup, seed=seed)
            records = f"run-{seed}.records.jsonl"
            result.load.save(results / records)
            m = result.metrics
            short = m.errors.get("short", 0)
            reasons = level_verdict(m, SLO, short)
            levels.append(LevelOutcome(name="confirm", rate=rate, seed=seed, passed=not reasons, reasons=reasons,
                                       metrics=m, server=result.server, records=records, rejected=short,
                                       attempts=1))
            print(f"run {seed}: {m.completed} ok, {m.failed} failed, p99 ITL {m.p99_itl_ms:.1f} ms, "
                  f"p99 TTFT {m.p99_ttft_ms:.0f} ms, keep-up {m.keep_up_ratio}, "
                  f"{'passes' if not reasons else 'fails: ' + '; '.join(reasons)}", flush=True)
    finally:
        engine.stop()
    pooled = rate_result(rate, levels, results, SLO, ConfirmOptions(), np.random.default_rng(0))
    p99 = "  ".join(f"{k} {v['value']:.1f} [{v['ci_low']:.1f}, {v['ci_high']:.1f}]" for k, v in pooled["p99"].items())
    print(f"defaults at {rate} req/s, {len(levels)} runs, {pooled['requests']} requests: "
          f"{'holds' if pooled['passed'] else 'fails'}; {p99}; {'; '.join(pooled['reasons'])}")
    (results / "head-to-head.json").write_text(json.dumps(
        {"config": engine.engine_args, "rate": rate, "requests_per_run": count, "first_set": first_set,
         "slo": SLO, "startup": startup, "pooled": pooled,
         "runs": [lv.model_dump(include={"seed", "passed", "reasons", "metrics"}) for lv in levels]},
        indent=1, default=str))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], Path(args[1]), *(float(a) for a in args[2:3]), *(int(a) for a in args[3:5]), *args[5:6])
