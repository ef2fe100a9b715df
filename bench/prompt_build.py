"""How long building a tune's prompt sets takes: `sets` sets of `count` requests of WORKLOAD, token-exact in
TOKENIZER, as `servetune tune` builds them before its first launch (the time limit's clock runs meanwhile).

    PYTHONPATH=src .venv/bin/python bench/prompt_build.py WORKLOAD TOKENIZER [--sets 8] [--count 608]

Prints the tokenizer's load time, then each set's seconds and the prompt tokens a second over all of them.
Results: docs/results/prompt-build.md."""

import argparse
import time
from pathlib import Path

from servetune.workload.load import load_workload
from servetune.workload.prompts import build_requests, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", type=Path)
    parser.add_argument("tokenizer")
    parser.add_argument("--sets", type=int, default=8, help="a tune builds max-levels + 2 (8 by default)")
    parser.add_argument("--count", type=int, default=608, help="requests a set: --requests + the warm-up's 8")
    args = parser.parse_args()
    started = time.perf_counter()
    tokenizer = load_tokenizer(args.tokenizer)
    print(f"tokenizer {time.perf_counter() - started:.2f} s")
    spec, tokens, took = load_workload(args.workload), 0, 0.0
    for k in range(args.sets):
        started = time.perf_counter()
        requests = build_requests(spec, tokenizer, seed=spec.seed + 1000 * k, count=args.count)
        seconds = time.perf_counter() - started
        tokens, took = tokens + sum(r.prompt_len for r in requests), took + seconds
        print(f"set {k}: {seconds:.2f} s")
    print(f"{args.sets} sets of {args.count}: {took:.1f} s, {tokens / took:,.0f} prompt tokens/s")


if __name__ == "__main__":
    main()
