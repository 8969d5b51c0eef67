#!/usr/bin/env bash
# GPU side (issue 26), after ../shared/gpu's install.sh: the 14B-shaped random-weight model's sign-off at a
# fixed number of HellaSwag docs (LIMIT, default 4,000: where SmolLM2's staged runs stop), --full, scored in
# pieces across leases. A piece is a set of cells (CELLS="--backends hf --dtypes fp32,bf16"); a later piece
# reruns the same command on the same run folder with other cells, which keeps the finished ones and scores
# the rest (the run folder travels between leases as $OUT/big14.tgz.part-*, parts of 15 MB: a file that comes
# back holds at most 16 MB; carried back in as FROM=path/big14.tgz, whole or as its parts).
#
# The run outlives the 10-minute call: `start` launches it in its own session (setsid) and returns; `poll`
# waits up to WAIT seconds (or until it exits) and prints its progress; `collect` stops it if it still runs
# (a finished cell is kept, the one in flight is lost) and packs the run folder into $OUT.
#
#   STEP=start [FROM=path/big14.tgz] [CELLS=...] bash scripts/gpu/issue26_big.sh
#   STEP=poll WAIT=540 bash scripts/gpu/issue26_big.sh
#   STEP=collect bash scripts/gpu/issue26_big.sh
#
# The code and data are copied to /tmp first: each call replaces the checkout's carried folders, and the
# run's later cells import the code when they start.
set -uo pipefail
RUN=/tmp/i26-big14
SRC=/tmp/big-src
LOG=/tmp/big.log
GPU=/tmp/big-gpu.csv
STEP=${STEP:-poll}

progress() {
  tail -n 15 "$LOG" 2>/dev/null
  for f in "$RUN"/cells/.tmp-*/cell.log "$RUN"/cells/*/cell.log; do
    [[ -f $f ]] && { echo "== $f"; grep -E -- "^--- " "$f" | tail -4; }
  done
  echo "== GPU (last 3 samples of $(wc -l < "$GPU" 2>/dev/null || echo 0))"; tail -n 3 "$GPU" 2>/dev/null
  date -u +%FT%TZ
}

case $STEP in
  start)
    source .gpu/bin/env.sh
    rm -rf "$SRC" && mkdir -p "$SRC" && cp -r evalparity task_configs scripts "$SRC/" && cp -rL .gpudata "$SRC/data"
    export PYTHONPATH="$SRC:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
    mkdir -p "$EVALPARITY_CACHE/wheels" && cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null
    t0=$(date +%s.%N)
    [[ -f /tmp/m14b/config.json ]] || python3 "$SRC/scripts/gpu/make_model.py" /tmp/m14b --shape qwen2.5-14b 2>&1 | tail -3
    echo "model ready after $(python3 -c "import time;print(round(time.time()-$t0,1))") s"; ls -la /tmp/m14b | tail -n +2
    if [[ -n ${FROM:-} ]]; then  # the folder of earlier pieces: cells that finished are kept, the rest scored
      rm -rf "$RUN" && cat "$FROM"* | tar xz -C /tmp && echo "resumed from $FROM:" && ls "$RUN/cells"
    fi
    read -r -a PIECE <<< "${CELLS:-}"
    setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 \
      > "$GPU" 2>&1 < /dev/null &
    cd "$SRC" || exit 1
    setsid nohup bash -c 'start=$(date +%s.%N); timeout "$0" python3 -m evalparity.cli run --device cuda \
        --model /tmp/m14b --tasks hellaswag --num-fewshot 0 --limit "$1" --full --datasets-dir data \
        --out "$2" --no-fail-on-inconclusive "${@:3}"; rc=$?
        echo "run exit $rc after $(python3 -c "import time;print(round(time.time()-$start,1))") s"' \
      "${BUDGET:-1500}" "${LIMIT:-4000}" "$RUN" "${PIECE[@]}" > "$LOG" 2>&1 < /dev/null &
    echo $! > /tmp/big.sid  # setsid execs in place here (a background job leads no group): its pid is the session's id
    sleep "${WAIT:-60}"; progress ;;
  poll)
    for _ in $(seq "$(( ${WAIT:-540} / 5 ))"); do grep -q "^run exit" "$LOG" && break; sleep 5; done
    progress ;;
  collect)
    # Ctrl-C to the run's whole session (timeout puts the run in a group of its own): it records what finished
    grep -q "^run exit" "$LOG" || { pkill -INT -s "$(cat /tmp/big.sid)"; sleep 20; }
    pkill -f "nvidia-smi --query-gpu" ; progress
    mkdir -p "$RUN/logs" && cp "$LOG" "$GPU" "$RUN/logs/" && cp /tmp/epcache/prepare.log "$RUN/logs/" 2>/dev/null
    for f in "$RUN"/cells/*/cell.log; do cp "$f" "$RUN/logs/$(basename "$(dirname "$f")").txt"; done
    # lm-eval's raw samples_*.jsonl are left behind (12.5 MB per cell at 4,000 docs): the run reads its own
    # sealed table (samples.parquet), and verification and resume do not need them
    (cd /tmp && tar cz --exclude='.tmp-*' --exclude='*.lock' --exclude='samples_*.jsonl' i26-big14 \
      | split -b 15m - "$OUT/big14.tgz.part-") && ls -la "$OUT" ;;
esac
