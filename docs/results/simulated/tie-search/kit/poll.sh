#!/usr/bin/env bash
# On the device: every SLEEP s, copy the rows out to $OUT and say how far they are.
W=/root/w
for i in $(seq ${LOOPS:-10}); do
  sleep ${SLEEP:-50}
  cp $W/out/* $OUT/ 2>/dev/null
  for c in head variant; do
    [ -f $W/out/$c.json ] && python3 -c "import json; r=json.load(open('$W/out/$c.json')); s=sorted(x['seed'] for x in r); print('$c', len(r), 'rows, last', s[-3:], flush=True)"
  done
  echo "ties: $(sort -un $W/out/ties.log 2>/dev/null | tr '\n' ' ')"
  date +%T; tail -c 200 $W/out/head.log; ls $W/out
done
