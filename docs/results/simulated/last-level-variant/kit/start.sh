#!/usr/bin/env bash
# On the device: copy the codes out of the tree, install the wheels, start the simulated tunes detached.
# env: FIRST N (variant), HFIRST HN (head check), WV WH (workers), LOOPS (poll loops after the start)
set -e
ROOT=$PWD W=/root/w; rm -rf $W; mkdir -p $W/out
cp -r sim14/head sim14/variant $W/
for c in head variant; do mkdir -p $W/$c/.cache && cp -r .cache/tiny-llama $W/$c/.cache/; done
python3 -m pip install -q --no-deps --target /tmp/simsite .gpu/simwheels/*.whl 2>&1 | tail -2
nproc; python3 --version
PYTHONPATH=/tmp/simsite python3 -c "import optuna, pydantic, scipy, numpy, yaml; print('optuna', optuna.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__)"
cd $W/variant && PYTHONPATH=$W/variant/src:/tmp/simsite setsid nohup python3 bench/simulate.py --first $FIRST --scenarios $N --workers $WV --tunes unlimited --json $W/out/variant.json > $W/out/variant.log 2>&1 < /dev/null &
cd $W/head && PYTHONPATH=$W/head/src:/tmp/simsite setsid nohup python3 bench/simulate.py --first $HFIRST --scenarios $HN --workers $WH --tunes unlimited --json $W/out/head.json > $W/out/head.log 2>&1 < /dev/null &
cd "$ROOT"
bash sim14/poll.sh
