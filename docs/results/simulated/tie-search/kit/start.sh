#!/usr/bin/env bash
# On the device: copy both codes out of the tree, install the wheels, start the variant on seeds FIRST..FIRST+N-1
# (WV workers) and the head on each seed the variant logs a wide tie for (WH workers), detached.
set -e
ROOT=$PWD W=/root/w; rm -rf $W; mkdir -p $W/out
cp -r sim15/head sim15/variant sim15/heads.py $W/
for c in head variant; do mkdir -p $W/$c/.cache && cp -r .cache/tiny-llama $W/$c/.cache/; done
python3 -m pip install -q --no-deps --target /tmp/simsite .gpu/simwheels/*.whl 2>&1 | tail -2
nproc; python3 --version
cd $W/variant && (TIE_LOG=$W/out/ties.log PYTHONPATH=$W/variant/src:/tmp/simsite setsid nohup bash -c "python3 bench/simulate.py --first $FIRST --scenarios $N --workers $WV --tunes unlimited --json $W/out/variant.json > $W/out/variant.log 2>&1; touch $W/out/variant.done" < /dev/null > /dev/null 2>&1 &)
cd $W/head && (PYTHONPATH=$W/head/src:/tmp/simsite setsid nohup python3 $W/heads.py $W/out/ties.log $W/out/variant.done $W/out/head.json $WH > $W/out/head.log 2>&1 < /dev/null &)
cd "$ROOT"
bash sim15/poll.sh
