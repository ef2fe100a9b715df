#!/usr/bin/env bash
# On the device: every 50 s, copy the rows out to $OUT and say how many came back.
W=/root/w
for i in $(seq ${LOOPS:-10}); do
  sleep ${SLEEP:-50}
  cp $W/out/* $OUT/ 2>/dev/null
  for c in head variant; do
    [ -f $W/out/$c.json ] && python3 -c "import json,sys; r=json.load(open('$W/out/$c.json')); s=sorted(x['seed'] for x in r); print('$c', len(r), 'rows, seeds', s[:1], '..', s[-1:], flush=True)"
  done
  date +%T; tail -c 300 $W/out/variant.log
done
