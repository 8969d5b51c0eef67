#!/usr/bin/env bash
# GPU side (issue 29), after ../shared/gpu's install.sh and scripts/gpu/install_ray.sh on the device: release
# questions as named cells on one H200, SmolLM2 on HellaSwag (staged, the default), against plain vllm-bf16.
# Records and report go to $OUT/<label>.tgz. MODE picks:
#   variants  fp8 weights, an fp8 KV cache, CUDA graphs, the batch-invariant kernels: each a --cell against
#             vllm-bf16 (and hf-bf16 against it: the cross-backend drift at the same precision, as a yardstick);
#             $COMPARE adds a --compare pair
#   served    the same model through `vllm serve` started by evalparity (--cell served=server:bf16) against the
#             in-process vllm-bf16
set -uo pipefail
source .gpu/bin/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
MODE=${MODE:-variants}
LABEL=${LABEL:-$MODE}
RUN=/tmp/i29-$LABEL
BUDGET=${BUDGET:-560}
mkdir -p "$EVALPARITY_CACHE/wheels"
cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null || true
case $MODE in
  variants)
    CELLS=(--backends vllm,hf --dtypes bf16 --cell vllm-fp8=vllm:bf16:quantization=fp8
           --cell vllm-kv8=vllm:bf16:kv_cache_dtype=fp8 --cell vllm-graphs=vllm:bf16:enforce_eager=false
           --cell vllm-bi=vllm:bf16:env.VLLM_BATCH_INVARIANT=1 --reference vllm-bf16
           ${COMPARE:+--compare "$COMPARE"}) ;;
  served)
    CELLS=(--backends vllm --dtypes bf16 --cell served=server:bf16 --reference vllm-bf16) ;;
esac
rm -rf "$RUN"
T0=$(date +%s.%N)
timeout "$BUDGET" python3 -m evalparity.cli run --device cuda --tasks hellaswag --num-fewshot 0 \
  --datasets-dir .gpudata --out "$RUN" --no-fail-on-inconclusive ${LIMIT:+--limit "$LIMIT"} "${CELLS[@]}" 2>&1 \
  | tail -50
echo "run $LABEL: exit ${PIPESTATUS[0]} after $(python3 -c "import time;print(round(time.time()-$T0,1))") s"
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
