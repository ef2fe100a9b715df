"""How fast can one servetune client process drive a zero-latency server?

    .venv/bin/python bench/client_overhead.py [--rate 2000] [--requests 20000] [--output-len 16]

Starts tests/fake_server.py in its own process, sends `--requests` requests at `--rate` req/s
(Poisson unless --burstiness says otherwise) and prints the achieved request rate, schedule lag
(start − scheduled) percentiles and the CPU the client and the server used.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from servetune.loadgen import LoadShape, Target, run_load_sync
from servetune.measure.metrics import schedule_lag_ms, summarize
from servetune.workload.request import RequestSpec

FAKE_SERVER = Path(__file__).resolve().parents[1] / "tests" / "fake_server.py"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--burstiness", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    args = parser.parse_args()

    server = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), "--token-delay-ms", str(args.token_delay_ms)],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        target = Target(f"http://127.0.0.1:{port}", "fake", args.endpoint)
        requests = [RequestSpec("benchmark prompt", 2, args.output_len)] * (args.requests + 100)
        server_cpu, cpu, wall = _cpu_s(server.pid), time.process_time(), time.perf_counter()
        result = run_load_sync(target, requests, LoadShape(request_rate=args.rate, burstiness=args.burstiness,
                                                           warmup_requests=100))
        wall = time.perf_counter() - wall
        cpu, server_cpu = time.process_time() - cpu, _cpu_s(server.pid) - server_cpu
    finally:
        server.terminate()
        server.wait()

    summary = summarize(result)
    lag = np.array([schedule_lag_ms(r) for r in result.records if not r.warmup])
    print(f"offered {args.rate:.0f} req/s (burstiness {args.burstiness}), {args.requests} requests x "
          f"{args.output_len} tokens, token delay {args.token_delay_ms} ms, {args.endpoint}")
    print(f"achieved {summary.request_throughput:.0f} req/s "
          f"(steady {summary.steady_request_rate or 0:.0f}), "
          f"completed {summary.completed}, errors {summary.errors}")
    print(f"schedule lag ms: p50 {np.percentile(lag, 50):.3f}  p90 {np.percentile(lag, 90):.3f}  "
          f"p99 {np.percentile(lag, 99):.3f}  max {lag.max():.3f}")
    print(f"client CPU {cpu / wall:.0%} of a core ({cpu / len(result.records) * 1e6:.0f} us/request), "
          f"server CPU {server_cpu / wall:.0%}, wall {wall:.1f} s")


if __name__ == "__main__":
    main()
