#!/usr/bin/env bash
# GPU side (issue 26, item 5), after ../shared/gpu's install.sh and one evalparity run (which prepares the
# embedded model in $EVALPARITY_CACHE): engines starting at once, alone, and staggered
# (scripts/gpu/coldstart_probe.py), plus `import vllm`'s own import times. Figures to $OUT.
set -uo pipefail
source .gpu/bin/env.sh
M=${EVALPARITY_CACHE:-/tmp/epcache}/models/SmolLM2-135M-Instruct
P=scripts/gpu/coldstart_probe.py
O=${OUT:-/tmp/probes}
mkdir -p "$O"
echo "pyc files under /tmp/site: $(find /tmp/site -name '*.pyc' | wc -l); py files: $(find /tmp/site -name '*.py' | wc -l)"
python3 -X importtime -c "import vllm" 2> "$O/importtime-vllm.txt"
sort -t'|' -k2 -n "$O/importtime-vllm.txt" | tail -15
for spec in ${PROBES:-v1:1:0:0 v3:3:0:0 v3h3:3:3:0 v3h3s4:3:3:4}; do
  IFS=: read -r label nv nh st <<< "$spec"
  timeout 200 python3 "$P" --model "$M" --vllm "$nv" --hf "$nh" --stagger "$st" --label "$label" --out "$O"
done
