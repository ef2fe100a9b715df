"""Replays the head search's tells (../last-level-variant/climbs/tell-*.log: the 16 seeds whose climbs reached their
last level) through the search of src/, and prints where its next rate first differs from the head's."""
import re, sys, glob, math
sys.path.insert(0, 'src')  # run from the repository root
from servetune.search.objective import RateSearch
for f in sorted(glob.glob('docs/results/simulated/last-level-variant/climbs/tell-*.log')):
    seed = f.split('-')[-1][:-4]
    trials = {}
    for line in open(f):
        m = re.match(r'(\d+) cap=([\d.]+) max=(\d+) rate=([\d.]+) ok=(\w+) far=(\w+) m=(\S+)', line)
        if not m: continue
        trials.setdefault(m[1], []).append(m)
    for tid, tells in trials.items():
        cap, mx = float(tells[0][2]), int(tells[0][3])
        head = RateSearch(capacity=cap, max_levels=mx); var = RateSearch(capacity=cap, max_levels=mx, flat_room=0.9)
        head.flat_room = 1e-300  # never
        for t in tells:
            mm = float(t[7]) if t[7] != 'None' else None
            for s in (head, var): s.tell(float(t[4]), t[5] == 'True', t[6] == 'True', mm)
            h, v = head.next_rate(), var.next_rate()
            if h != v:
                print(seed, tid[-4:], 'cap', cap, 'after', [(round(r,2), ok, round(var.margins.get(r, float('nan')),2)) for r, ok in var.tried], 'head', h and round(h,2), 'var', v and round(v,2))
                break
