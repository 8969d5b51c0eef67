#!/usr/bin/env bash
# GPU side (nvidia-h200-x2), after ../shared/gpu's install.sh and scripts/gpu/install_ray.sh: the scale-out
# measurement of results/scaleout-h200x2/README.md. One step per call (each fits the 10-minute call limit):
#   MODE=one    the 6-cell matrix on one GPU (CUDA_VISIBLE_DEVICES=0): cells one after another
#   MODE=two    the same matrix on both GPUs: evalparity puts the cells on a local Ray instance
#   MODE=extras a TF32 cell and a sharded repeat added to the two-GPU run, then drift on 100 prompts
# Every step is resumable (finished cells are skipped) and leaves $OUT/<mode>.tgz.
set -uo pipefail
source .gpu/bin/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
mkdir -p "$EVALPARITY_CACHE/wheels"
cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null || true
MODE=${MODE:?MODE=one, two or extras}
LIMIT=${LIMIT:-5000}
BUDGET=${BUDGET:-560}
COMMON=(--device cuda --tasks hellaswag --limit "$LIMIT" --num-fewshot 0 --datasets-dir .gpudata
        --no-fail-on-inconclusive)
T0=$(date +%s)
case $MODE in
  prepare)
    python3 -m evalparity.cli models prepare ;;
  one)
    CUDA_VISIBLE_DEVICES=0 timeout "$BUDGET" python3 -m evalparity.cli run "${COMMON[@]}" --out /tmp/so-1gpu
    echo "one GPU: exit $? after $(( $(date +%s) - T0 )) s" ;;
  two)
    timeout "$BUDGET" python3 -m evalparity.cli run "${COMMON[@]}" --out /tmp/so-2gpu
    echo "two GPUs: exit $? after $(( $(date +%s) - T0 )) s"
    # Does placement change what is computed? The same cells' tables, one GPU vs two.
    python3 - <<'PY'
import pandas as pd, pathlib
for d in sorted(pathlib.Path("/tmp/so-2gpu/cells").glob("*/samples.parquet")):
    one = pathlib.Path("/tmp/so-1gpu/cells") / d.parent.name / "samples.parquet"
    if one.exists():
        a, b = pd.read_parquet(one), pd.read_parquet(d)
        same = a.shape == b.shape and (a["prompt_hash"].values == b["prompt_hash"].values).all()
        dl = (a["loglikelihood"] - b["loglikelihood"]).abs()
        print(f"{d.parent.name}: aligned={same} identical={bool((dl.fillna(0) == 0).all())} max|dLL|={dl.max():.3g}")
PY
    ;;
  extras)
    timeout "$BUDGET" python3 -m evalparity.cli run "${COMMON[@]}" --out /tmp/so-2gpu --tf32 vllm \
      --repeat vllm:fp32:dp2
    echo "extras: exit $? after $(( $(date +%s) - T0 )) s"
    LEFT=$(( BUDGET - ($(date +%s) - T0) ))
    timeout "$LEFT" python3 -m evalparity.cli drift --run-dir /tmp/so-2gpu --device cuda \
      --cells "${DRIFT_CELLS:-vllm-fp32-tf32,vllm-bf16,vllm-fp16}" --n-prompts "${DRIFT_PROMPTS:-100}" --gen-tokens 8
    echo "drift: exit $? after $(( $(date +%s) - T0 )) s"
    python3 -m evalparity.cli report /tmp/so-2gpu --no-fail-on-inconclusive >/dev/null 2>&1 ;;
esac
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader || true
if [[ -n ${OUT:-} && $MODE != prepare ]]; then
  RUN=/tmp/so-2gpu; [[ $MODE == one ]] && RUN=/tmp/so-1gpu
  (cd "$RUN" && tar czf "$OUT/$MODE.tgz" --ignore-failed-read spec.json report stats/verdicts.json \
     stats/comparisons.parquet stats/deltas.parquet cells/*/cell.json shards/*/cell.json drift/*.json 2>/dev/null)
  ls -la "$OUT"
fi
