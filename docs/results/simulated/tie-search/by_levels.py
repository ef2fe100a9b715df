"""Decidable trials above 1.05x and below 0.85x their truth, by the scenario's levels a trial (`Scenario.max_levels`, 4-6).
usage: SERVETUNE_NO_VLLM=1 PYTHONPATH=src python by_levels.py ROWS.json.gz"""
import gzip, json, sys
from collections import Counter
from servetune.testing.simengine import draw_scenario
rows = json.load(gzip.open(sys.argv[1]))
c = Counter()
for r in rows:
    sc = draw_scenario(r['seed'], limit_s=900.0)
    for t in r['unlimited'].get('trials', []):
        if t['decidable'] and t['measured']:
            v = t['measured'] / t['truth']
            k = sc.max_levels
            c[(k, 'n')] += 1; c[(k, 'above')] += v > 1.05; c[(k, 'below')] += v < 0.85
for k in sorted({k for k, _ in c}):
    print(k, 'levels: decidable', c[(k, 'n')], 'above', c[(k, 'above')], 'below', c[(k, 'below')])
