#!/usr/bin/env bash
# GPU side (issue 29), after ../shared/gpu's install.sh and scripts/gpu/install_ray.sh on the device: release
# questions as named cells on one H200, SmolLM2 on HellaSwag (staged, the default), against plain vllm-bf16.
# Records and report go to $OUT/<label>.tgz. MODE picks:
#   variants  fp8 weights, an fp8 KV cache, CUDA graphs, the batch-invariant kernels: each a --cell against
#             vllm-bf16 (and hf-bf16 against it: the cross-backend drift at the same precision, as a yardstick);
#             $COMPARE adds a --compare pair
#   served    the same model through `vllm serve` started by evalparity (--cell served=server:bf16) against the
#             in-process vllm-bf16
#   quant     fp8 weights, an fp8 KV cache and the batch-invariant kernels against hf-fp32 (the default
#             reference) and, through --compare, against the plain vllm bf16 cell (vllm-base)
#   floors    noise floors, --full --limit $LIMIT (default 300): vllm-base, vllm-fp8 and vllm-bi each again at
#             batch size 1 (every request alone) against the batched cell
#   gen       CUDA graphs against eager on generation: GSM8K (lm-eval's default few-shot), vllm-graphs
#             against vllm-bf16
#   noreuse   hf-fp32 and one candidate (cand=vllm:bf16), both scored: the time a sign-off takes today
#   runner    vLLM's two GPU model runners against each other: vllm-fp32-v1 and vllm-bf16-v1
#             (env.VLLM_USE_V2_MODEL_RUNNER=0) against the reference vllm-fp32, and vllm-bf16-v1 also
#             against vllm-bf16 (vLLM's own choice: V2 for SmolLM2), --full --limit $LIMIT (default 2000):
#             the runner's own drift, beside the dtypes'
#   reuse     the same candidate with --reference-from the quant run's hf-fp32 ($SOURCE, default
#             /tmp/i29-quant): the time a stored reference saves
# Set WHEELS=.gpuwheel (carried) to install extra wheels (tenacity, for lm-eval's API models) first.
set -uo pipefail
source scripts/gpu/device_env.sh  # env.sh, RUNNER, BYTECODE, CODE, this checkout on the path
MODE=${MODE:-variants}
LABEL=${LABEL:-$MODE}
RUN=/tmp/i29-$LABEL
BUDGET=${BUDGET:-560}
if [[ -n ${WHEELS:-} ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl 2>&1 | tail -2
fi
TASK=(--tasks hellaswag --num-fewshot 0)
EXTRA=()
case $MODE in
  quant)
    CELLS=(--cell vllm-base=vllm:bf16 --cell vllm-fp8=vllm:bf16:quantization=fp8
           --cell vllm-kv8=vllm:bf16:kv_cache_dtype=fp8 --cell vllm-bi=vllm:bf16:env.VLLM_BATCH_INVARIANT=1
           --compare vllm-fp8:vllm-base --compare vllm-kv8:vllm-base --compare vllm-bi:vllm-base) ;;
  floors)
    CELLS=(--cell vllm-base=vllm:bf16 --cell vllm-fp8=vllm:bf16:quantization=fp8
           --cell vllm-bi=vllm:bf16:env.VLLM_BATCH_INVARIANT=1
           --repeat vllm-base:1 --repeat vllm-fp8:1 --repeat vllm-bi:1)
    EXTRA=(--full --limit "${LIMIT:-300}") ;;
  gen)
    TASK=(--tasks gsm8k --num-fewshot 0)  # the mirror has GSM8K's test split only: no few-shot examples
    CELLS=(--backends vllm --dtypes bf16 --cell vllm-graphs=vllm:bf16:enforce_eager=false --reference vllm-bf16) ;;
  noreuse)
    CELLS=(--cell cand=vllm:bf16) ;;
  reuse)
    CELLS=(--cell cand=vllm:bf16 --reference-from "${SOURCE:-/tmp/i29-quant}:hf-fp32") ;;
  variants)
    CELLS=(--backends vllm,hf --dtypes bf16 --cell vllm-fp8=vllm:bf16:quantization=fp8
           --cell vllm-kv8=vllm:bf16:kv_cache_dtype=fp8 --cell vllm-graphs=vllm:bf16:enforce_eager=false
           --cell vllm-bi=vllm:bf16:env.VLLM_BATCH_INVARIANT=1 --reference vllm-bf16
           ${COMPARE:+--compare "$COMPARE"}) ;;
  runner)
    CELLS=(--backends vllm --dtypes fp32,bf16 --cell vllm-fp32-v1=vllm:fp32:env.VLLM_USE_V2_MODEL_RUNNER=0
           --cell vllm-bf16-v1=vllm:bf16:env.VLLM_USE_V2_MODEL_RUNNER=0 --reference vllm-fp32
           --compare vllm-bf16-v1:vllm-bf16)
    EXTRA=(--full --limit "${LIMIT:-2000}") ;;
  served)
    CELLS=(--backends vllm --dtypes bf16 --cell served=server:bf16 --reference vllm-bf16) ;;
esac
rm -rf "$RUN"
T0=$(date +%s.%N)
if [[ ${#EXTRA[@]} -eq 0 && -n ${LIMIT:-} ]]; then EXTRA=(--limit "$LIMIT"); fi
timeout "$BUDGET" python3 -m evalparity.cli run --device cuda "${TASK[@]}" \
  --datasets-dir .gpudata --out "$RUN" --no-fail-on-inconclusive "${EXTRA[@]}" "${CELLS[@]}" 2>&1 \
  | tee "/tmp/run-$LABEL.log" | tail -${TAIL:-45}
echo "run $LABEL: exit ${PIPESTATUS[0]} after $(python3 -c "import time;print(round(time.time()-$T0,1))") s"
if grep -q "cannot connect to Ray" "/tmp/run-$LABEL.log"; then  # the run's own Ray instance: why it refused
  for f in /tmp/evalparity-ray-*.log; do echo "== $f"; tail -n 25 "$f"; done
  for d in /tmp/evalparity-ray-*/session_latest/logs; do
    for f in "$d"/gcs_server.out "$d"/raylet.out "$d"/raylet.err; do echo "== $f"; tail -n 12 "$f"; done
  done
fi
if [[ -n ${OUT:-} && -d $RUN ]]; then
  mkdir -p "$RUN/logs"
  for f in "$RUN"/stages/.tmp-*/cell.log "$RUN"/cells/*/cell.log "$RUN"/attempts/*/*/*/cell.log; do
    [[ -f $f ]] || continue
    n=$(basename "$(dirname "$f")"); tail -60 "$f" > "$RUN/logs/$n.txt"
  done
  (cd "$RUN" && tar czf "$OUT/$LABEL.tgz" spec.json run.json stats/verdicts.json cells/*/cell.json \
     stages/round-*.json logs report/report.md 2>/dev/null)
  ls -la "$OUT"
fi
