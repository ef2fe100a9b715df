"""On the device: the head code's unlimited rows for every seed the variant logged a wide tie for, as they appear."""
import json, os, sys, time
from concurrent.futures import ProcessPoolExecutor, wait, FIRST_COMPLETED
sys.path.insert(0, "bench")
import simulate
ties, done_flag, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows, submitted, running = [], set(), set()
with ProcessPoolExecutor(workers) as pool:
    while True:
        seeds = {int(s) for s in open(ties).read().split() if s.strip().isdigit()} if os.path.exists(ties) else set()
        for s in sorted(seeds - submitted):
            submitted.add(s); running.add(pool.submit(simulate.run, s, ("unlimited",)))
        if running:
            finished, running = wait(running, timeout=10, return_when=FIRST_COMPLETED)
            for f in finished:
                rows.append(f.result()); rows.sort(key=lambda r: r["seed"])
                open(out, "w").write(json.dumps(rows, indent=1))
                print("head", rows[-1]["seed"], len(rows), flush=True)
        elif os.path.exists(done_flag):
            break
        else:
            time.sleep(10)
print("heads done", len(rows), flush=True)
