#!/usr/bin/env bash
# GPU side, after ../shared/gpu's install.sh on the device (see results/reference-h200/README.md):
# the H200 reference run. Resumable: run it again on the warm machine and finished cells are skipped.
# Writes the run to $RUN (default /tmp/ref-run, outside the synced tree) and a tarball of its report,
# verdicts, cell metadata and drift summaries to $OUT/reference.tgz when $OUT is set.
set -uo pipefail
source .gpu/bin/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
RUN=${RUN:-/tmp/ref-run}
BUDGET=${BUDGET:-540}   # seconds this call may spend on the run before packing what exists
mkdir -p "$EVALPARITY_CACHE/wheels"
cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null || true
T0=$(date +%s)
timeout "$BUDGET" python3 -m evalparity.cli run --device cuda \
  --tasks hellaswag,mmlu_abstract_algebra,mmlu_college_medicine,mmlu_high_school_us_history,gsm8k \
  --task-limit gsm8k=300 --num-fewshot 0 --datasets-dir .gpudata --out "$RUN" --no-fail-on-inconclusive
echo "run: exit $? after $(( $(date +%s) - T0 )) s"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
if [[ -f $RUN/stats/verdicts.json && ! -f $RUN/drift/vllm-fp16.json && $LEFT -gt 120 ]]; then
  T1=$(date +%s)
  timeout "$LEFT" python3 -m evalparity.cli drift --run-dir "$RUN" --device cuda \
    --cells vllm-fp32,vllm-fp32-tf32,vllm-bf16,vllm-fp16 --n-prompts 200 --gen-tokens 16
  echo "drift: exit $? after $(( $(date +%s) - T1 )) s"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
if [[ -n ${OUT:-} ]]; then
  (cd "$RUN" && tar czf "$OUT/reference.tgz" spec.json report stats/verdicts.json stats/comparisons.parquet \
     stats/deltas.parquet stats/flips.parquet stats/generations.parquet cells/*/cell.json drift/*.json)
  ls -la "$OUT"
fi
