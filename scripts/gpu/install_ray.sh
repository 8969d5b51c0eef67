#!/usr/bin/env bash
# GPU side, after both parts of stage_ray.sh are in /tmp/raystage: reassemble, check, install into /tmp/site.
set -euo pipefail
cd /tmp/raystage
NAME=$(cat NAME)
cat r00 r01 > "$NAME"
sha256sum -c --quiet SHA256
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$NAME"
PYTHONPATH=/tmp/site python3 -c 'import ray; print("ray", ray.__version__, "OK")'
