"""ITL verdicts on saved levels: how the p99 ITL test decides each level, its pass side clustered by request alone
(before 2026-12-03) and two ways, by request and by 1-second window (`servetune.measure.verdict`, now).

collect: launch one config, measure its capacity, then full levels (no early stop) at fractions of that capacity,
         `--reps` times each, and save every level's raw records:
    PYTHONPATH=src .venv/bin/python bench/itl_verdicts.py collect --model $PWD/.cache/tiny-llama \
        --workload bench/decode.yaml --config '{"max_num_batched_tokens": 128, "max_num_seqs": 128}' --out DIR
replay: each saved level (`*.records.jsonl` under the directories given) fed to the level test as its requests
        finish, as a trial does: the decision under each rule, when a fail stopped it, and the share of gaps over.
    PYTHONPATH=src .venv/bin/python bench/itl_verdicts.py replay --itl 20 DIR...
"""

import argparse
import functools
import json
import math
from pathlib import Path
from unittest import mock

import numpy as np
import yaml

from servetune.engine import Engine, launched
from servetune.loadgen import LoadResult, LoadShape, RequestRecord, Target
from servetune.measure import verdict
from servetune.measure.bench import measure_level
from servetune.measure.metrics import itls_ms
from servetune.trial.server import reset_prefix_cache
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer


def collect(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    workload = WorkloadSpec.model_validate(yaml.safe_load(args.workload.read_text()))
    tokenizer = load_tokenizer(args.model)
    engine = Engine(args.model, json.loads(args.config), args.out / "server.log")
    with launched(engine):
        target, capacity = Target(engine.base_url, args.model, workload.endpoint), None
        rates = [math.inf] + [f for _ in range(args.reps) for f in args.fractions]
        for k, rate in enumerate(rates):
            rate = rate if capacity is None else round(rate * capacity, 2)
            reset_prefix_cache(engine.base_url)
            warmup = 8 if k == 0 else 0
            requests = build_requests(workload, tokenizer, seed=1000 + k, count=args.requests + warmup)
            level = measure_level(target, requests, LoadShape(request_rate=rate, warmup_requests=warmup, seed=k))
            level.load.save(args.out / f"level-{k:02d}-rate-{rate}.records.jsonl")
            capacity = capacity or level.metrics.request_throughput
            print(f"level {k} at {rate} req/s: p99 ITL {level.metrics.p99_itl_ms:.1f} ms", flush=True)


def decide(records: list[RequestRecord], bound_ms: float) -> tuple[str, int]:
    """The level's decision on its measured `records` (with the second a fail stopped it) and the requests it
    counted."""
    ordered = sorted(records, key=lambda r: r.index)
    t0 = ordered[0].scheduled_ns
    test = verdict.LevelTest({"itl_p99_ms": bound_ms}, first=min(40, len(records)),
                             due_ns=[r.scheduled_ns - t0 for r in ordered], first_index=ordered[0].index)
    for r in sorted(records, key=lambda r: r.end_ns):
        if test.add(r) == verdict.Decision.FAIL:
            return f"fail at {(r.end_ns - t0) / 1e9:.0f} s", test.requests
    return test.finish().value, test.requests


def replay(args: argparse.Namespace) -> None:
    by_request = functools.partial(verdict.itl_bounds, by_window=False)
    print("| level | gaps over | pass side by request | two-way (now) |\n|---|---|---|---|")
    for path in sorted(p for d in args.dirs for p in d.rglob("*.records.jsonl")):
        measured = [r for r in LoadResult.load(path).records if not r.warmup]
        records = [r for r in measured if r.ok]
        gaps = np.array([g for r in records for g in itls_ms(r)])
        if not len(gaps) or not records[0].scheduled_ns < records[-1].scheduled_ns:
            continue  # a capacity level: every request at once, nothing counted after its fill
        with mock.patch.object(verdict, "itl_bounds", by_request):
            before, _ = decide(measured, args.itl)
        now, counted = decide(measured, args.itl)
        print(f"| {path.parent.name}/{path.name.removesuffix('.records.jsonl')} "
              f"| {100 * np.mean(gaps > args.itl):.2f}% | {before} | {now} ({counted} requests) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--model", required=True)
    c.add_argument("--workload", type=Path, required=True)
    c.add_argument("--config", default="{}", help="engine args as JSON")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--fractions", type=float, nargs="+", default=[0.45, 0.6, 0.75, 0.9])
    c.add_argument("--reps", type=int, default=3)
    c.add_argument("--requests", type=int, default=300)
    r = sub.add_parser("replay")
    r.add_argument("--itl", type=float, required=True, help="the p99 ITL bound (ms)")
    r.add_argument("dirs", type=Path, nargs="+")
    args = parser.parse_args()
    collect(args) if args.command == "collect" else replay(args)


if __name__ == "__main__":
    main()
