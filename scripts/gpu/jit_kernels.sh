#!/usr/bin/env bash
# GPU side (issue 28), after ../shared/gpu's install.sh: which kernels a drift's HF cells have CUDA JIT-compile
# from PTX on a machine whose JIT cache (~/.nv/ComputeCache) is empty: the first drift on a fresh machine is the
# slow one, and so is one after the cache is removed (results/drift-h200, session 31). Empties the cache, runs
# a drift of $CELLS (hf-bf16,hf-fp16) against hf-fp32 on $N (1000) HellaSwag prompts without a run, then lists
# the cache's entries and the kernel names inside them (mangled; c++filt them off the device) into
# $OUT/$LABEL-kernels.txt, and the drift's records into $OUT/$LABEL.tgz.
set -uo pipefail
source scripts/gpu/device_env.sh  # env.sh, RUNNER, BYTECODE, CODE, this checkout on the path
LABEL=${LABEL:-jit}
N=${N:-1000}
C=${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache}
M=$(python3 -c "from evalparity.data import embedded; print(embedded.model_path())" 2>&1 | tail -1)
source scripts/gpu/prompts.sh
prompts "$N" /tmp/hs-$LABEL.txt
[[ -z ${KEEP_CACHE:-} ]] && rm -rf "$C" && echo "CUDA JIT cache $C removed"
D=/tmp/$LABEL; rm -rf "$D"
T0=$(date +%s.%N)
timeout "${BUDGET:-120}" python3 -m evalparity.cli drift --model "$M" --prompts /tmp/hs-$LABEL.txt --n-prompts "$N" \
  --cells "${CELLS:-hf-bf16,hf-fp16}" --reference hf-fp32 --device cuda --out "$D" 2>&1 | grep -E "load .* probe|error" | head
echo "drift $LABEL: $(python3 -c "import time;print(round(time.time()-$T0,1))") s"
{
  echo "cache $C: $(find "$C" -type f 2>/dev/null | wc -l) files, $(du -sh "$C" 2>/dev/null | cut -f1)"
  find "$C" -type f -printf "%s %p\n" 2>/dev/null | sort -rn | head -40
  echo "--- kernel names (entries' strings starting _Z), by how many entries hold them"
  python3 - "$C" <<'PY'
import collections, pathlib, re, sys
seen = collections.Counter()
for f in pathlib.Path(sys.argv[1]).rglob("*"):
    if f.is_file() and f.stat().st_size > 1024:
        seen.update(set(re.findall(rb"_Z[A-Za-z0-9_]{8,}", f.read_bytes())))
for name, n in seen.most_common(300):
    print(n, name.decode())
PY
} > "$OUT/$LABEL-kernels.txt" 2>&1
head -45 "$OUT/$LABEL-kernels.txt"
(cd "$D" && tar czf "$OUT/$LABEL.tgz" --exclude='reference' --exclude='dump' --exclude='*.safetensors' . 2>/dev/null)
