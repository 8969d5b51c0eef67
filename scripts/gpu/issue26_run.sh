#!/usr/bin/env bash
# GPU side (issue 26), after ../shared/gpu's install.sh and scripts/gpu/install_ray.sh on the device: the
# issue's command, staged (the default), timed end to end; its run folder's records and the cells' logs go
# to $OUT/<label>.tgz. MODE picks the run:
#   staged   the command as a user types it (first call on a fresh machine: cold caches; again: warm)
#   fresh    the same with empty compile caches (Triton, vLLM, torch inductor) but a warm page cache:
#            tells the compile caches' share of a cold start from the imports'
#   full     --full (every document), for the same verdicts' comparison
#   pocock   --spending pocock: α spent nearly evenly over the looks (earlier stops when drift is small)
#   profile  the staged command with every cell under cProfile (EVALPARITY_PROFILE=1) and the run's own
#            process too (setup.pstats): where a cold start goes, function by function (cProfile slows
#            Python-heavy code: not a timing run)
#   sharded  --full --limit $LIMIT (default 4000) --shards $SHARDS (default 2): every cell as replicas side by
#            side on the GPU, against the staged rounds' per-cell rates (are the vLLM cells CPU-bound per process?)
#   big      the 14B-shaped random-weight model, --full --limit $LIMIT (default 200): each cell's load and
#            rate on one H200, to price a sign-off at the stopping n
set -uo pipefail
source scripts/gpu/device_env.sh  # env.sh, RUNNER, BYTECODE, CODE, this checkout on the path
MODE=${MODE:-staged}
LABEL=${LABEL:-$MODE}
RUN=/tmp/i26-$LABEL
BUDGET=${BUDGET:-560}
EXTRA=()
PY=(python3)
case $MODE in
  profile)
    export EVALPARITY_PROFILE=1
    PY=(python3 -m cProfile -o /tmp/setup-$LABEL.pstats) ;;
  fresh)
    F=/tmp/fresh-$LABEL; rm -rf "$F"; mkdir -p "$F"
    export TRITON_CACHE_DIR=$F/triton VLLM_CACHE_ROOT=$F/vllm TORCHINDUCTOR_CACHE_DIR=$F/inductor \
      XDG_CACHE_HOME=$F/xdg ;;
  full) EXTRA=(--full) ;;
  sharded) EXTRA=(--full --limit "${LIMIT:-4000}" --shards "${SHARDS:-2}") ;;
  pocock) EXTRA=(--spending pocock) ;;
  big)
    [[ -f /tmp/m14b/config.json ]] || python3 scripts/gpu/make_model.py /tmp/m14b --shape qwen2.5-14b
    EXTRA=(--full --limit "${LIMIT:-200}" --model /tmp/m14b) ;;
esac
VLLM_PY=evalparity/backends/vllm.py
if [[ -n ${VLLM_MP:-} ]]; then  # an experiment: vLLM's engine core in a process of its own (the product sets 0)
  cp "$VLLM_PY" /tmp/vllm.py.orig
  sed -i "s/env\[\"VLLM_ENABLE_V1_MULTIPROCESSING\"\] = \"0\"/env[\"VLLM_ENABLE_V1_MULTIPROCESSING\"] = \"$VLLM_MP\"/" "$VLLM_PY"
  grep -n 'VLLM_ENABLE_V1_MULTIPROCESSING"\] =' "$VLLM_PY"
fi
if [[ -n ${MPS:-} ]]; then  # an experiment: the cells' CUDA contexts through a private MPS server (concurrent kernels)
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-$LABEL/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-$LABEL/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  command -v nvidia-cuda-mps-control || ls /usr/bin/nvidia-cuda-mps* /usr/local/nvidia/bin 2>&1 | head -5
  nvidia-cuda-mps-control -d && echo "MPS control daemon started in $CUDA_MPS_PIPE_DIRECTORY"
fi
read -r -a MORE <<< "${ARGS:-}"  # extra arguments for the run, e.g. ARGS="--mps off"
EXTRA+=("${MORE[@]}")
rm -rf "$RUN"
if [[ -n ${UTIL:-} ]]; then  # UTIL=1: the GPU's utilisation every 0.5 s while the run runs (util.csv in its folder)
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 > "/tmp/util-$LABEL.csv" &
  UTIL_PID=$!
fi
T0=$(date +%s.%N)
timeout "$BUDGET" "${PY[@]}" -m evalparity.cli run --device cuda --tasks hellaswag --num-fewshot 0 \
  --datasets-dir .gpudata --out "$RUN" --no-fail-on-inconclusive "${EXTRA[@]}" 2>&1 | tail -40
status=${PIPESTATUS[0]}
if [[ -n ${UTIL_PID:-} ]]; then kill "$UTIL_PID"; cp "/tmp/util-$LABEL.csv" "$RUN/util.csv" 2>/dev/null; fi
[[ -n ${VLLM_MP:-} ]] && cp /tmp/vllm.py.orig "$VLLM_PY"  # this call's later runs get the product's code
if [[ -n ${MPS:-} ]]; then
  tail -5 "$CUDA_MPS_LOG_DIRECTORY"/control.log "$CUDA_MPS_LOG_DIRECTORY"/server.log 2>/dev/null
  echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
echo "run $LABEL: exit $status after $(python3 -c "import time;print(round(time.time()-$T0,1))") s"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
if [[ -n ${OUT:-} && -d $RUN ]]; then
  mkdir -p "$RUN/logs"
  for f in "$RUN"/stages/.tmp-*/cell.log "$RUN"/cells/*/cell.log "$RUN"/shards/*/cell.log; do
    [[ -f $f ]] || continue
    n=$(basename "$(dirname "$f")")
    if [[ -n ${KEEP:-} ]]; then cp "$f" "$RUN/logs/$n.txt"; continue; fi  # KEEP=1: the whole log
    grep -E "took|Loading|loading|init engine|compil|Triton|--- |warmup|KV cache|Runner|runner" "$f" \
      | head -80 > "$RUN/logs/$n.txt"
  done
  cp /tmp/setup-$LABEL.pstats "$RUN/" 2>/dev/null || true
  cp "$EVALPARITY_CACHE/prepare.log" "$RUN/logs/prepare.log" 2>/dev/null || true  # a first run's model preparation, by phase
  ( # what the run's first engines compiled into the per-machine caches (CACHES=1)
    [[ -n ${CACHES:-} ]] || exit 0
    for d in "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" "${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}" \
             "$HOME/.cache" "$HOME/.nv/ComputeCache" "${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$USER}"; do
      du -sh "$d" 2>/dev/null
    done
    ls -la --time-style=+%T "$HOME/.cache" 2>/dev/null
    find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name "*.json" ! -name "__grp__*" -printf "%TT %f\n" 2>/dev/null | sort
  ) > "$RUN/logs/caches.txt" 2>&1
  (cd "$RUN" && tar czf "$OUT/$LABEL.tgz" spec.json run.json util.csv stats/verdicts.json cells/*/cell.json shards/*/cell.json mps.log \
     stages/round-*.json stages/*/cell.json logs report/report.md warmup.log setup-*.pstats \
     stages/*/profile.txt stages/*/profile.pstats stages/.tmp-*/profile.txt stages/.tmp-*/profile.pstats 2>/dev/null)
  ls -la "$OUT"
fi
