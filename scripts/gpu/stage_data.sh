#!/usr/bin/env bash
# CPU side, from the checkout's root: copy the dataset mirror files the H200 reference run reads into
# .gpudata/ (git-ignored), to be carried with the install transfer: ../shared does not travel.
set -euo pipefail
SRC=${1:-../shared/data}
EXCL=$(git rev-parse --git-path info/exclude)
grep -qxF '/.gpudata/' "$EXCL" || echo '/.gpudata/' >> "$EXCL"
rm -rf .gpudata
for d in Rowan/hellaswag/default openai/gsm8k/main cais/mmlu/abstract_algebra cais/mmlu/college_medicine \
         cais/mmlu/high_school_us_history; do
  mkdir -p ".gpudata/$d"
  cp "$SRC/$d"/*.jsonl ".gpudata/$d/"
done
du -sh .gpudata
