"""The truth a goodput rate is held against: for one config of one workload, the rates at which vLLM's own client
(`vllm bench serve`, not servetune's) sees every p99 SLO held and the server keep up over long steady levels.

One launch of the config; then, for each rate, fresh prompts (seeded apart from a tune's and verify's) sent by vLLM's
client for `--seconds` of Poisson arrivals, its per-request results saved (`--save-detailed`). Each level is read
as servetune reads its own: the requests sent in its steady part (after the p99 end-to-end latency of its requests,
before the last p99 latency of its sends, when vLLM's client stops sending and the server drains) give
each SLO's point p99, and the keep-up ratio over that window (`servetune.measure.steady.keep_up`) says whether the
server completed what arrived. A rate holds when every p99 is within its bound and the ratio is at least 95%.
`--between LOW HIGH` bisects (geometric) `--steps` times; `--rates` measures the rates given. The rows and the
truth (the highest rate held below the lowest not held) go to DIR/truth.json as they come; every level's raw JSON
stays in DIR.

usage: .venv/bin/python bench/goodput_truth.py --model PATH --workload FILE.yaml --slo ttft_p99_ms=2000 ...
           (--rates R [R ...] | --between LOW HIGH [--steps 4]) [--config FILE.yaml] [--seconds 240] --out DIR
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from servetune.engine import Engine, launched
from servetune.loadgen.records import RequestRecord
from servetune.measure.metrics import e2el_ms, itls_ms, tpot_ms, ttft_ms
from servetune.measure.slo import parse_slo
from servetune.measure.steady import KEEP_UP_FRACTION, keep_up, sent_to_the_end
from servetune.options import read_config_yaml
from servetune.trial.server import reset_prefix_cache
from servetune.verify import VLLM_CLIENT_START_S, VerifyPlan, run_vllm_bench, vllm_bench_argv, write_dataset
from servetune.workload import build_requests, load_tokenizer, load_workload

SEED_OFFSET = 300_000  # prompts apart from a tune's (seed + 1000) and verify's (+ 200_000)
VALUES = {"ttft_p99_ms": ttft_ms, "tpot_p99_ms": tpot_ms, "e2el_p99_ms": e2el_ms}


def records_of(result: dict) -> list[RequestRecord]:
    """vLLM's client's detailed results as servetune's records (times in ns of its own clock): each successful
    request's send, token times (first token, then its inter-token gaps) and end."""
    out = []
    for i, start in enumerate(result["start_times"]):
        if result["errors"][i] or not result["ttfts"][i]:
            continue
        sent = int(start * 1e9)
        chunks = sent + (np.cumsum([result["ttfts"][i], *result["itls"][i]]) * 1e9).astype(np.int64)
        latency = result.get("latencies") or result.get("e2els")  # vLLM versions name it either way
        end = sent + int(latency[i] * 1e9) if latency else int(chunks[-1])
        out.append(RequestRecord(index=i, prompt_len=result["input_lens"][i], expected_output_len=0, warmup=False,
                                 scheduled_ns=sent, start_ns=sent, chunk_ns=chunks.tolist(), end_ns=end,
                                 output_tokens=result["output_lens"][i]))
    return out


def judge_level(records: list[RequestRecord], slo: dict[str, float], failed: int) -> dict:
    """One level's row: each SLO's p99 over the requests sent in the steady part, the keep-up ratio over it."""
    window = sent_to_the_end(records)
    counted = [r for r in records if window.start_ns <= r.start_ns < window.end_ns]
    p99 = {}
    for name in slo:
        values = ([g for r in counted for g in itls_ms(r)] if name == "itl_p99_ms"
                  else [v for r in counted if (v := VALUES[name](r)) is not None])
        p99[name] = float(np.percentile(values, 99)) if values else None
    kept = keep_up(records, window)
    held = (not failed and bool(counted) and all(v is not None and v <= slo[k] for k, v in p99.items())
            and kept.ratio is not None and kept.ratio >= KEEP_UP_FRACTION)
    return {"window_s": round(window.seconds, 1), "counted": len(counted), "p99": p99, "keep_up_ratio": kept.ratio,
            "keep_up_se": kept.se, "failed": failed, "held": held}


def measure(engine: Engine, args: argparse.Namespace, rate: float, k: int, tokenizer) -> dict:
    """vLLM's client at `rate` for `args.seconds` of arrivals on fresh prompts; the level's row."""
    spec = load_workload(args.workload)
    n = max(100, math.ceil(rate * args.seconds))
    spec = spec.model_copy(update={"request_rate": rate, "num_requests": n, "seed": spec.seed + k})
    requests = build_requests(spec, tokenizer, seed=spec.seed + SEED_OFFSET + 1000 * k, count=n)
    dataset, result = args.out / f"rate-{rate:.3f}.requests.jsonl", args.out / f"rate-{rate:.3f}.vllm-bench.json"
    write_dataset(dataset, requests)
    plan = VerifyPlan(model=args.model, config=args.config, workload=spec, slo=args.slo)
    argv = vllm_bench_argv(engine, plan, dataset, result) + ["--save-detailed"]
    reset_prefix_cache(engine.base_url)
    failure = run_vllm_bench(argv, result.with_suffix(".log"), result, VLLM_CLIENT_START_S + 3 * args.seconds + 600,
                             env=os.environ | {"OPENAI_API_KEY": engine.secret})
    if failure:
        return {"rate": rate, "error": failure}
    detailed = json.loads(result.read_text())
    row = judge_level(records_of(detailed), args.slo, detailed["failed"])
    return {"rate": rate, "requests": n, "completed": detailed["completed"], **row}


def truth(rows: list[dict]) -> dict:
    """The highest rate held below the lowest rate not held (None where none is)."""
    failing = min((r["rate"] for r in rows if not r.get("held")), default=None)
    held = [r["rate"] for r in rows if r.get("held") and (failing is None or r["rate"] < failing)]
    return {"held": max(held, default=None), "not_held": failing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="a vLLM config YAML (default: vLLM's defaults)")
    parser.add_argument("--slo", action="append", required=True, help="e.g. ttft_p99_ms=2000 (repeatable)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--rates", type=float, nargs="+")
    group.add_argument("--between", type=float, nargs=2, metavar=("LOW", "HIGH"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=240.0, help="of arrivals at each rate")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.model = str(Path(args.model).resolve())
    args.slo = parse_slo({k: float(v) for k, v in (s.split("=", 1) for s in args.slo)}).as_dict()  # checked
    args.config = read_config_yaml(args.config) if args.config else {}
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    engine = Engine(args.model, args.config, args.out / "server.log")
    tokenizer = load_tokenizer(args.model)
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "truth.json").write_text(json.dumps({
            "model": args.model, "workload": str(args.workload), "config": args.config, "slo": args.slo,
            "seconds": args.seconds, "command": " ".join(sys.argv), "rows": rows, "truth": truth(rows)}, indent=1))

    with launched(engine):
        if args.rates:
            for k, rate in enumerate(args.rates):
                record(measure(engine, args, rate, k, tokenizer))
        else:
            low, high = args.between
            for k in range(args.steps):
                rate = math.sqrt(low * high)
                row = measure(engine, args, rate, k, tokenizer)
                record(row)
                low, high = (rate, high) if row.get("held") else (low, rate)

if __name__ == "__main__":
    main()
