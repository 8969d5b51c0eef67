#!/usr/bin/env bash
# GPU side, after every part of stage_ray.sh is in /tmp/raystage: reassemble, check, install into /tmp/site.
set -euo pipefail
cd /tmp/raystage
NAME=$(cat NAME)
cat $(ls r[0-9][0-9] | sort) > "$NAME"
sha256sum -c --quiet SHA256
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$NAME"
PYTHONPATH=/tmp/site python3 -c 'import ray; print("ray", ray.__version__, "OK")'
# Byte-code for everything in /tmp/site, as a user's `pip install` writes it (pip compiles by default; the
# recipe and this script install with --no-compile): without it a fresh machine's first run compiles vLLM,
# lm-eval and Ray in every cell at once, which no user's first run does (results/staged-h200: cold 263.7 s
# without, 215.0 s with). About 5 s on the H200's 16 cores.
python3 -m compileall -q -j 16 /tmp/site > /dev/null 2>&1 || true
