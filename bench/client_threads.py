"""Watch the threads of the processes whose command line holds PATTERN: each thread's scheduling policy, and the CPU
time it ran and the time it waited runnable for a CPU (/proc/PID/task/TID/schedstat), sampled every `--every` s
(processes that start later included) until none has matched for `--gone` s, or `--wait` s have passed. For
`servetune verify`'s two clients: does each run at the real-time priority it is given, in every thread, and is a
thread of it starved?

    python bench/client_threads.py 'vllm.benchmarks import serve' OUT.jsonl [--every 0.5] [--wait 900] \
        [--gone 120] [--dump-after S]

OUT.jsonl: one line a sample and thread (t, pid, tid, comm, policy, rt_priority, run_ns, wait_ns, state); the
last line is a summary per thread (run and wait over the samples, the policies seen). With --dump-after S, the
Python stack of every thread S seconds in (`py-spy dump --nonblocking`, beside this Python) goes to OUT.py-spy.txt.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}


def matching(pattern: str) -> list[int]:
    """The pids (other than this one) whose command line holds `pattern`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if pattern in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def threads(pid: int) -> list[dict]:
    """Each thread of `pid` now: its name, state, policy, real-time priority and schedstat."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
        except OSError:
            continue
        comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        # fields[0] is stat's 3rd field (state); rt_priority and policy are its 40th and 41st
        out.append({"pid": pid, "tid": int(task.name), "comm": comm, "state": fields[0],
                    "rt_priority": int(fields[37]), "policy": POLICIES.get(int(fields[38]), fields[38]),
                    "run_ns": int(run_ns), "wait_ns": int(wait_ns)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern")
    parser.add_argument("out", type=Path)
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("--wait", type=float, default=900.0, help="seconds to wait for a process to appear")
    parser.add_argument("--dump-after", type=float, default=None)
    parser.add_argument("--gone", type=float, default=120.0, help="stop when none has matched for this long")
    args = parser.parse_args()
    deadline = time.monotonic() + args.wait
    while not (pids := matching(args.pattern)):
        if time.monotonic() > deadline:
            raise SystemExit(f"no process matches {args.pattern!r}")
        time.sleep(0.1)
    first: dict[int, dict] = {}
    last: dict[int, dict] = {}
    policies: dict[int, set[str]] = {}
    start = seen = time.monotonic()
    with open(args.out, "w") as out:
        while (now := time.monotonic()) < min(start + args.wait, seen + args.gone):
            if pids := matching(args.pattern):
                seen = now
            sample = [t for pid in pids for t in threads(pid)]
            for t in sample:
                out.write(json.dumps({"t": round(now - start, 3), **t}) + "\n")
                first.setdefault(t["tid"], t)
                last[t["tid"]] = t
                policies.setdefault(t["tid"], set()).add(t["policy"])
            if args.dump_after is not None and now - start >= args.dump_after:
                with open(args.out.with_suffix(".py-spy.txt"), "w") as dump:
                    for pid in pids:
                        subprocess.run([str(Path(sys.executable).with_name("py-spy")), "dump", "--nonblocking",
                                        "--pid", str(pid)], stdout=dump, stderr=subprocess.STDOUT)
                args.dump_after = None
            time.sleep(args.every)
        summary = [{"pid": t["pid"], "tid": tid, "comm": t["comm"], "policies": sorted(policies[tid]),
                    "run_s": (t["run_ns"] - first[tid]["run_ns"]) / 1e9,
                    "wait_s": (t["wait_ns"] - first[tid]["wait_ns"]) / 1e9} for tid, t in last.items()]
        out.write(json.dumps({"summary": summary}) + "\n")


if __name__ == "__main__":
    main()
