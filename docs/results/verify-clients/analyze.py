"""Every figure of docs/results/verify-clients.md, from the raw files of its runs:

    python3 docs/results/verify-clients/analyze.py > docs/results/verify-clients/analysis.txt
"""

import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).parent
RUNS = ["base1", "base2", "fixed1", "aba1", "aba2", "final"]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.open(path, "rt")]


def clients(run: str) -> list[tuple[str, dict]]:
    """(name, `verify.ClientResult` as JSON) of each client run, in the order they ran."""
    result = json.loads((HERE / run / "verify.json").read_text())
    first = HERE / run / "verify.first-vllm.json"
    return ([("vllm (1st)", json.loads(first.read_text()))] if first.exists() else []) + [
        ("servetune", result["servetune"]), ("vllm", result["vllm"])]


def table() -> None:
    print("== client against server, per run (ms; server: vLLM's histograms over that client's run)")
    print(f"{'run':7} {'client':10} {'TTFT mean':>9} {'srv':>6} {'TTFT p99':>9} {'srv p99 range':>14} "
          f"{'TPOT mean':>9} {'srv':>5} {'E2EL mean':>9} {'srv':>6}")
    for run in RUNS:
        for name, c in clients(run):
            m, s = c["metrics"], c["server"]
            p99 = s["ttft"]["p99"]
            print(f"{run:7} {name:10} {m['mean_ttft_ms']:9.1f} {s['ttft']['mean_ms']:6.1f} {m['p99_ttft_ms']:9.1f} "
                  f"{p99['low_ms']:6.0f}-{p99['high_ms']:<7.0f} {m['mean_tpot_ms']:9.2f} {s['tpot']['mean_ms']:5.2f} "
                  f"{m['mean_e2el_ms']:9.0f} {s['e2el']['mean_ms']:6.0f}")


def samples(path: Path) -> list[dict]:
    """A sampler's samples (its last line, a summary, is left out: a sampler stopped early has none)."""
    return [row for row in lines(path) if "summary" not in row]


def per_thread(rows: list[dict]) -> list[dict]:
    """Each thread's policies seen, and its CPU run and wait between its first and last sample (s)."""
    first: dict[int, dict] = {}
    last: dict[int, dict] = {}
    policies: dict[int, set[str]] = {}
    for row in rows:
        first.setdefault(row["tid"], row)
        last[row["tid"]] = row
        policies.setdefault(row["tid"], set()).add(row["policy"])
    return [{"comm": row["comm"], "policies": sorted(policies[tid]),
             "run_s": (row["run_ns"] - first[tid]["run_ns"]) / 1e9,
             "wait_s": (row["wait_ns"] - first[tid]["wait_ns"]) / 1e9} for tid, row in last.items()]


def threads() -> None:
    print("\n== threads of each process while it ran: policy, CPU run (s), runnable but waiting for a CPU (s)")
    for run in RUNS[1:]:
        for who in ("vllm-client", "servetune"):
            busy = [t for t in per_thread(samples(HERE / run / f"{who}.threads.jsonl.gz"))
                    if t["run_s"] > 0.001 or t["wait_s"] > 0.01]
            print(f"{run:7} {who:11} " + "; ".join(f"{t['comm']} {'/'.join(p[6:] for p in t['policies'])} "
                                                     f"{t['run_s']:.3f} {t['wait_s']:.3f}" for t in busy))


def level_start(run: str) -> float:
    """When servetune's level began on the sampler's clock: its event loop thread's first real-time sample."""
    return next(r["t"] for r in samples(HERE / run / "servetune.threads.jsonl.gz")
                if r["comm"] == "python" and r["policy"] == "SCHED_FIFO")


def pool_waits(run: str) -> None:
    """uvloop's pool threads' waits for a CPU of over 20 ms between two samples during servetune's level."""
    rows = samples(HERE / run / "servetune.threads.jsonl.gz")
    start, last = level_start(run), {}
    end = max(r["t"] for r in rows if r["policy"] == "SCHED_FIFO" and r["comm"] == "python")
    total, policies = 0.0, set()
    for r in rows:
        if r["comm"] != "libuv-worker":
            continue
        before = last.get(r["tid"])
        last[r["tid"]] = r
        if before and start <= r["t"] <= end + 0.5:
            waited = (r["wait_ns"] - before["wait_ns"]) / 1e6
            total, policies = total + waited, policies | {r["policy"]}
            if waited > 20:
                print(f"  {run} pool thread {r['tid']} ({r['policy']}) waited {waited:.0f} ms for a CPU by "
                      f"{r['t'] - start:.2f} s into the level")
    loop = [r for r in rows if r["policy"] == "SCHED_FIFO" and r["comm"] == "python"][1:]  # the first: since before
    most = max(b["wait_ns"] - a["wait_ns"] for a, b in zip(loop, loop[1:])) / 1e6
    print(f"  {run}: servetune's event loop thread waited at most {most:.1f} ms per sample during the level")
    print(f"  {run}: {len(last)} pool threads, {'/'.join(sorted(policies))} during the level, where they waited "
          f"{total:.0f} ms in all")


def ttft_spikes(run: str, top: int = 10) -> None:
    """servetune's slowest first tokens: when sent, TTFT, and the longest gap of the other streams meanwhile."""
    records = lines(HERE / run / "verify.records.jsonl.gz")[1:]
    origin = min(r["scheduled_ns"] for r in records)
    vllm = json.loads(gzip.open(HERE / run / "verify.vllm-bench.json.gz", "rt").read())
    print(f"  {run}: max schedule lag {max(r['start_ns'] - r['scheduled_ns'] for r in records) / 1e6:.1f} ms")
    for r in sorted(records, key=lambda r: r["start_ns"] - r["chunk_ns"][0])[:top]:
        first = r["chunk_ns"][0]
        gaps = [b - a for o in records if o is not r for a, b in zip(o["chunk_ns"], o["chunk_ns"][1:])
                if a < first and b > r["start_ns"]]
        print(f"  request {r['index']:3}: sent {(r['start_ns'] - origin) / 1e9:6.2f} s, TTFT "
              f"{(first - r['start_ns']) / 1e6:4.0f} ms (vLLM's client, same prompt: "
              f"{vllm['ttfts'][r['index']] * 1000:3.0f} ms); other streams' longest gap meanwhile "
              f"{max(gaps) / 1e6:.0f} ms")


def queue_times() -> None:
    print("\n== vLLM's client: from a request's arrival in its schedule to its send (`queue_times`), max ms")
    for run in RUNS:
        outputs = sorted((HERE / run).glob("verify*vllm-bench.json.gz"))
        print(f"{run:7} " + ", ".join(f"{path.name.split('.')[1]} "
                                      f"{1000 * max(json.load(gzip.open(path, 'rt'))['queue_times']):.1f}"
                                      for path in outputs))


def connections() -> None:
    print("\n== connections each client opened (distinct client ports in the server's access log; warm-up first)")
    for run in RUNS:
        log = gzip.open(HERE / run / "verify.server.log.gz", "rt").read()
        ports = re.findall(r'127\.0\.0\.1:(\d+) - "POST /v1/completions', log)
        parts = [ports[:8]] + [ports[8 + 600 * i:8 + 600 * (i + 1)] for i in range((len(ports) - 8) // 600)]
        names = ["warm-up"] + [name for name, _ in clients(run)]
        print(f"{run:7} " + ", ".join(f"{name} {len(set(p))}" for name, p in zip(names, parts)))


if __name__ == "__main__":
    table()
    threads()
    print("\n== uvloop's pool in servetune's process during its level, and servetune's slowest first tokens")
    for run in ("aba1", "aba2", "final"):
        pool_waits(run)
        ttft_spikes(run)
    queue_times()
    connections()
