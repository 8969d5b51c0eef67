#!/usr/bin/env bash
# CPU side, from the checkout's root: the Ray wheel for the H200 machine (cp312; Ray's own dependencies are
# in that machine's image or in ../shared/gpu's bundle), split into $RAY_PARTS (default 4) parts under
# .gpuray/r00, .gpuray/r01, ... (git-ignored), so that each transfer (the working tree travels with it: 38 MiB
# in session 24) stays under 64 MiB. Carry one part per transfer and run
#   mkdir -p /tmp/raystage && cp .gpuray/rNN/* /tmp/raystage/
# on the device; then `bash scripts/gpu/install_ray.sh` there installs it into /tmp/site.
set -euo pipefail
RAY_PIN=${RAY_PIN:-ray==2.60.0}
EXCL=$(git rev-parse --git-path info/exclude)
grep -qxF '/.gpuray/' "$EXCL" || echo '/.gpuray/' >> "$EXCL"
CACHE=${GPU_WHEEL_CACHE:-$HOME/.cache/gpu-wheels}/ray
mkdir -p "$CACHE"
ls "$CACHE"/ray-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d "$CACHE" "$RAY_PIN"
WHL=$(ls "$CACHE"/ray-*.whl | head -1)
rm -rf .gpuray && mkdir -p .gpuray/tmp
split -n "${RAY_PARTS:-4}" -d -a 2 "$WHL" .gpuray/tmp/r
for f in .gpuray/tmp/r*; do p=$(basename "$f"); mkdir -p .gpuray/$p && mv "$f" .gpuray/$p/; done
rmdir .gpuray/tmp
(cd "$CACHE" && sha256sum "$(basename "$WHL")") > .gpuray/r00/SHA256
echo "$(basename "$WHL")" > .gpuray/r00/NAME
du -sh .gpuray/r*
