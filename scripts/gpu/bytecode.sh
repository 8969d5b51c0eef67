#!/usr/bin/env bash
# GPU side, once per lease after ../shared/gpu's install.sh (and install_ray.sh): byte-code for the image's own
# Python packages (torch, transformers, numpy ...), as a user's `pip install` writes it.
#
# Why: the lent image sets PYTHONDONTWRITEBYTECODE=1, and session 31's profile of `evalparity hidden`'s worker
# (results/drift-h200, `hidden-h40prof`) counted 1,769 modules compiled from source in that one process, /tmp/site
# being compiled already: the image's packages seem to ship no byte-code (the counts printed below say), so every
# Python process there compiles every module it imports, every time. On the 2-core CPU machine `from transformers import LlamaForCausalLM` takes 4.8 s with byte-code and
# 11.5-12.4 s without. No user's machine does that: pip compiles at install. /tmp/site (the recipe's wheels)
# is compiled by install_ray.sh already; this does the image's folders.
#
# In place where the image's folders are writable; otherwise into a prefix (/tmp/pyc), which every later
# process is then told of through /tmp/ep-bytecode.sh (device_env.sh sources it). Prints what it found and what it
# took, so the lease's notes can say so.
set -uo pipefail
T0=$(date +%s.%N)
mapfile -t DIRS < <(python3 - <<'EOF'
import importlib.util, os
seen = []
for name in ("torch", "transformers", "numpy", "safetensors", "tokenizers", "huggingface_hub", "jinja2", "yaml"):
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    if spec is None or not spec.origin:
        continue
    site = os.path.dirname(os.path.dirname(spec.origin))
    if not site.startswith("/tmp/site") and site not in seen:
        seen.append(site)
print("\n".join(seen))
EOF
)
PREFIX=""
for d in "${DIRS[@]}"; do
  n_py=$(find "$d/torch" "$d/transformers" -name '*.py' 2>/dev/null | wc -l)
  n_pyc=$(find "$d/torch" "$d/transformers" -name '*.pyc' 2>/dev/null | wc -l)
  echo "bytecode: $d: torch + transformers $n_py .py, $n_pyc .pyc before; writable: $([[ -w $d ]] && echo yes || echo no)"
  [[ -w $d ]] || PREFIX=/tmp/pyc
done
if [[ -n $PREFIX ]]; then
  # a prefix replaces every __pycache__ folder for the processes that use it: /tmp/site's too
  PYTHONPYCACHEPREFIX=$PREFIX python3 -m compileall -q -j 16 "${DIRS[@]}" /tmp/site > /dev/null 2>&1
  echo "export PYTHONPYCACHEPREFIX=$PREFIX" > /tmp/ep-bytecode.sh
else
  python3 -m compileall -q -j 16 "${DIRS[@]}" > /dev/null 2>&1
  : > /tmp/ep-bytecode.sh
fi
echo "bytecode: compiled ${DIRS[*]} ${PREFIX:+into $PREFIX }in $(python3 -c "import time; print(round(time.time() - $T0, 1))") s"
