"""Two sets of bench/simulate.py rows on the same seeds: where the recommended config's true goodput moved by more than
2%, and every decidable trial's mean |log(measured / truth)|.  usage: python3 recommended.py HEAD.json.gz NEW.json.gz"""
import gzip, json, math, sys


def load(path):
    return {r['seed']: r for r in json.load(gzip.open(path)) if 'error' not in r['unlimited']}


def mean_log_error(rows):
    v = [abs(math.log(t['measured'] / t['truth'])) for r in rows.values() for t in r['unlimited']['trials']
         if t['decidable'] and t['measured']]
    return f"{sum(v) / len(v):.3f} over {len(v)} decidable trials"


head, new = load(sys.argv[1]), load(sys.argv[2])
up, down = [], []
for s in sorted(set(head) & set(new)):
    a, b = head[s]['unlimited']['recommended_true'], new[s]['unlimited']['recommended_true']
    if a and b and b > 1.02 * a:
        up.append(f"{s} {a:.2f}->{b:.2f}")
    if a and b and b < 0.98 * a:
        down.append(f"{s} {a:.2f}->{b:.2f}")
print(f"seeds {len(set(head) & set(new))}; the recommendation's truth up >2%: {len(up)} {up}; down >2%: {len(down)} {down}")
print(f"mean |log ratio|: head {mean_log_error(head)}, new {mean_log_error(new)}")
