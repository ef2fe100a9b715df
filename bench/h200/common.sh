# Sourced by run.sh and truth.sh with NAME WORKLOAD SLO...: sets $name, $workload, $res (/root/res/NAME, made) and
# $slos (their --slo flags), the environment, and writes the start time and the GPU's facts under $res;
# `tune BUDGET TIME_LIMIT` runs the tune into $res/tune, its log and exit status in $res/tune.log, with $TUNE_ARGS
# (more options, e.g. a reference config) added. MODEL_LEN=N serves a copy of the kit's model with an N-token context.
set -u
name=$1 workload=$2; shift 2
res=/root/res/$name; mkdir -p "$res"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1 COLUMNS=160
slos=(); for s in "$@"; do slos+=(--slo "$s"); done
date +%s > "$res/t0"
if [ -n "${MODEL_LEN:-}" ]; then
  long=$(dirname "$SERVETUNE_GPU_MODEL")/model-$MODEL_LEN; rm -rf "$long"; cp -r "$SERVETUNE_GPU_MODEL" "$long"
  sed -i "s/\"max_position_embeddings\": [0-9]*/\"max_position_embeddings\": $MODEL_LEN/" "$long/config.json"
  export SERVETUNE_GPU_MODEL=$long
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$res/gpu.txt" 2>&1

tune() {
  python3 -m servetune tune --model "$SERVETUNE_GPU_MODEL" --workload "$workload" "${slos[@]}" --strategy optuna \
    --budget "$1" --engine-arg load-format=dummy --time-limit "$2" --out "$res/tune" ${TUNE_ARGS:-} > "$res/tune.log" 2>&1
  echo "tune rc=$?" >> "$res/tune.log"
}
