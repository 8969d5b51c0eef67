#!/usr/bin/env bash
# GPU side (issue 28), after ../shared/gpu's install.sh: the embedded model prepared, then
# benchmarks/hidden_bench.py on SmolLM2, $N (10000) HellaSwag prompts, 3 layers, last token, bf16, in $PASSES
# passes (default 2: the first right after the install, the next warm), each into a folder of its own
# (the bench refuses a folder that holds a finished route); the routes' records, their logs and the output go to
# $OUT/$LABEL.tgz (LABEL default hidden-passes; tensors left out).
set -uo pipefail
source scripts/gpu/device_env.sh  # env.sh, RUNNER, BYTECODE, CODE, this checkout on the path
python3 -c "from evalparity.data import embedded; print(embedded.model_path())" 2>&1 | tail -1
LABEL=${LABEL:-hidden-passes}
D=/tmp/$LABEL
rm -rf "$D"
for k in $(seq 1 "${PASSES:-2}"); do
  mkdir -p "$D/pass$k"
  timeout "${BUDGET:-280}" python3 benchmarks/hidden_bench.py --model "$EVALPARITY_CACHE/models/SmolLM2-135M-Instruct" \
    --device cuda --datasets-dir .gpudata --n-prompts "${N:-10000}" --routes "${ROUTES:-batched,hf,vllm}" \
    --keep "$D/pass$k" 2>&1 | grep -v -i warning | tee "$D/pass$k/bench.txt" | grep -E "prompts/s|speedup"
done
if [[ -n ${OUT:-} ]]; then
  (cd "$D" && tar czf "$OUT/$LABEL.tgz" --exclude='*.safetensors' --exclude='*.pt' .)
fi
