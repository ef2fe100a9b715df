"""Scenario SEED unlimited: the first two trials' levels with their ITL percentiles, most in flight and E2E."""
import os, sys, tempfile
from dataclasses import replace
from pathlib import Path
from servetune.testing.simengine import draw_scenario, simulate
seed = int(sys.argv[1])
sc = replace(draw_scenario(seed), limit_s=None)
print(sc.slo, sc.workload)
with tempfile.TemporaryDirectory(dir='/dev/shm') as out:
    res = simulate(sc, Path('/work/main/.cache/tiny-llama'), Path(out) / 'o')
for row in res.rows[:2]:
    print(' T', row.trial, row.goodput_rate, row.request_throughput)
    for l in row.levels:
        m = l.metrics
        print('    %-9s %8.2f %-9s n=%5d dur=%6.1f p50itl=%.2f p90itl=%.2f p99itl=%.2f maxconc=%s e2e_mean=%.0f p99e2e=%.0f' % (l.name, l.rate, l.verdict, m.completed, m.duration, m.median_itl_ms or 0, m.p90_itl_ms or 0, m.p99_itl_ms or 0, m.max_concurrent_requests, m.mean_e2el_ms or 0, m.p99_e2el_ms or 0))
