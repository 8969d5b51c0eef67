#!/usr/bin/env bash
# GPU side (issue 28), after ../shared/gpu's install.sh (and an issue-26 run for MODE=drift): batched drift
# probes and hidden-state extraction, timed; each mode's records go to $OUT/<label>.tgz. MODE picks:
#   drift   SmolLM2: every cell of the run $RUN (default /tmp/i26-staged) against hf-fp32 on $N (1000) of
#           its prompts, as the issue's goal asks (≤ 60 s of probing in all, ≥ 100 prompts/s per cell)
#   big     the 14B-shaped random-weight model: vllm-bf16 against hf-fp32 on $N (200) HellaSwag prompts
#           (≥ 10 prompts/s); random weights: right for speed and memory, meaningless for accuracy
#   hidden  benchmarks/hidden_bench.py on SmolLM2, $N (10000) HellaSwag prompts, 3 layers, last token
set -uo pipefail
source scripts/gpu/device_env.sh  # env.sh, RUNNER, BYTECODE, CODE, this checkout on the path
MODE=${MODE:-drift}
LABEL=${LABEL:-$MODE}
BUDGET=${BUDGET:-560}
D=/tmp/i28-$LABEL
rm -rf "$D" "/tmp/output-$LABEL.txt"
# PRE=pagecache|jitcache: before the work, drop the kernel's page cache, or CUDA's JIT cache (~/.nv; Triton's and
# vLLM's caches stay): which of the two brings back the slow first drift of a fresh machine (results/drift-h200,
# session 30)
case ${PRE:-} in
  "") ;;
  pagecache) sync; { echo 3 > /proc/sys/vm/drop_caches && echo "page cache dropped"; } ||
    { echo "PRE=pagecache: cannot drop the page cache here" >&2; exit 2; } ;;
  jitcache) rm -rf "${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache}" && echo "CUDA JIT cache removed" ;;
  triton) rm -rf "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" "${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}" &&
    echo "Triton's and vLLM's caches removed" ;;
  pycache) find "$PWD/evalparity" /tmp/site -name __pycache__ -type d -prune -exec rm -rf {} + &&
    echo "bytecode caches of evalparity and /tmp/site removed" ;;
  *) echo "unknown PRE=$PRE (pagecache, jitcache, triton or pycache)" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 > /tmp/util-$LABEL.csv &
UTIL=$!
# what else the machine did meanwhile (a first drift's slow HF cells: another process's CPU, or the GPU's clocks?)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,pstate,clocks_event_reasons.active \
  --format=csv,noheader -lms 500 > /tmp/clocks-$LABEL.csv &
CLOCKS=$!
top -b -d 1 -w 200 -o %CPU 2>/dev/null | awk '/^top -/{print} /^ *[0-9]+ /{if ($9+0 >= 20) print; fflush()}' > /tmp/top-$LABEL.txt &
TOP=$!
T0=$(date +%s.%N)
source scripts/gpu/prompts.sh  # prompts N FILE
case $MODE in
  drift)
    # the whole output kept (its timestamped lines say when each side's process ended): into $D afterwards
    read -r -a MORE <<< "${ARGS:-}"  # extra arguments, e.g. ARGS="--mps off"
    timeout "$BUDGET" python3 -m evalparity.cli drift --run-dir "${RUN:-/tmp/i26-staged}" --n-prompts "${N:-1000}" \
      --out "$D" ${MORE[@]+"${MORE[@]}"} 2>&1 | tee "/tmp/output-$LABEL.txt" | tail -30 ;;
  big)
    [[ -f /tmp/m14b/config.json ]] || python3 scripts/gpu/make_model.py /tmp/m14b --shape qwen2.5-14b
    prompts "${N:-200}" /tmp/hs-big.txt
    timeout "$BUDGET" python3 -m evalparity.cli drift --model /tmp/m14b --prompts /tmp/hs-big.txt \
      --n-prompts "${N:-200}" --cells vllm-bf16 --reference hf-fp32 --device cuda --out "$D" 2>&1 | tail -30 ;;
  hidden)
    mkdir -p "$D"
    timeout "$BUDGET" python3 benchmarks/hidden_bench.py --model "$EVALPARITY_CACHE/models/SmolLM2-135M-Instruct" \
      --device cuda --datasets-dir .gpudata --n-prompts "${N:-10000}" --keep "$D" 2>&1 | tee "$D/bench.txt" | tail -40 ;;
esac
RC=${PIPESTATUS[0]}
kill $UTIL $CLOCKS $TOP 2>/dev/null; pkill -f "^top -b -d 1" 2>/dev/null
python3 - /tmp/util-$LABEL.csv "$D" <<'PY'
import glob, json, sys
from datetime import datetime
rows = [x.split(", ") for x in open(sys.argv[1]).read().splitlines() if x.count(",") == 2]
samples = [(datetime.strptime(r[0], "%Y/%m/%d %H:%M:%S.%f").timestamp(), int(r[1].split()[0]))
           for r in rows if r[1].split()[0].isdigit()]
u = [x for _, x in samples]
if u:
    print(f"GPU busy: mean {sum(u) / len(u):.0f} % over {len(u) / 2:.0f} s sampled; >= 50 % in {sum(x >= 50 for x in u)} of {len(u)} samples")
# over the work alone: the probing and generation windows the drift records give (reference and cells)
wins = {}
for path in glob.glob(f"{sys.argv[2]}/*.json"):
    rec = json.load(open(path))
    for side, timing in ((rec.get("cell"), rec.get("timing")), (rec.get("reference"), rec.get("reference_timing"))):
        for phase, w in ((timing or {}).get("windows") or {}).items():
            wins[(side, phase)] = w
for label, keep in (("probing and generating", None), ("probing", "probe"), ("generating", "generate")):
    ws = [w for (_, ph), w in wins.items() if keep in (None, ph)]
    inside = [x for t, x in samples if any(a <= t <= b for a, b in ws)]
    if inside:
        print(f"GPU busy while {label} (any side): mean {sum(inside) / len(inside):.0f} % over {len(inside) / 2:.0f} s; "
              f">= 50 % in {sum(x >= 50 for x in inside)} of {len(inside)} samples")
PY
echo "$MODE $LABEL: exit $RC after $(python3 -c "import time;print(round(time.time()-$T0,1))") s"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
if [[ -n ${OUT:-} && -d $D ]]; then
  cp /tmp/util-$LABEL.csv /tmp/clocks-$LABEL.csv /tmp/top-$LABEL.txt "$D/" 2>/dev/null
  cp "/tmp/output-$LABEL.txt" "$D/output.txt" 2>/dev/null
  (cd "$D" && tar czf "$OUT/$LABEL.tgz" --exclude='reference' --exclude='dump' --exclude='*.safetensors' --exclude='*.pt' . 2>/dev/null)
  ls -la "$OUT"
fi
