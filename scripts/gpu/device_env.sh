# device_env.sh: `source scripts/gpu/device_env.sh` first in every GPU-side script: the recipe's env.sh, then what
# makes the lent machine a user's (RUNNER, BYTECODE), this checkout's evalparity on the path, its cache, and the
# embedded model's wheel where evalparity looks for it.
source .gpu/bin/env.sh
# RUNNER picks vLLM's GPU model
# runner. The recipe's env.sh sets VLLM_USE_V2_MODEL_RUNNER=0 (V1), which no user's machine sets; "vllm" (the
# default since session 26) unsets it, so that vLLM chooses as it does for a user (in 0.26, V2 for dense
# decoders); "v1" / "v2" force one. Each vLLM cell records the runner it got (settings.model_runner).
case ${RUNNER:-vllm} in
  vllm) unset VLLM_USE_V2_MODEL_RUNNER ;;
  v1) export VLLM_USE_V2_MODEL_RUNNER=0 ;;
  v2) export VLLM_USE_V2_MODEL_RUNNER=1 ;;
  *) echo "RUNNER must be vllm, v1 or v2"; exit 2 ;;
esac
# BYTECODE: how Python's byte-code is had. "user" (default): as on a user's machine, the packages compiled at
# install (scripts/gpu/bytecode.sh, once per lease) and byte-code written for what is not (evalparity's own
# modules, at their first import); the image's PYTHONDONTWRITEBYTECODE=1 is unset. "source": as the lent image
# has it, every module compiled from source in every process (an empty prefix, nothing written), for an A/B.
case ${BYTECODE:-user} in
  user) unset PYTHONDONTWRITEBYTECODE; [[ -f /tmp/ep-bytecode.sh ]] && source /tmp/ep-bytecode.sh ;;
  source) mkdir -p /tmp/pyc-empty; export PYTHONDONTWRITEBYTECODE=1 PYTHONPYCACHEPREFIX=/tmp/pyc-empty ;;
  *) echo "BYTECODE must be user or source"; exit 2 ;;
esac
# CODE=DIR (a folder of the checkout, carried, holding another commit's evalparity/ package): run that code
# instead, for an A/B on one machine (scripts/gpu/old_code.sh makes one). PYTHONSAFEPATH: `python -m` and
# `-c` put the working directory (this checkout, with its evalparity/) first on sys.path, ahead of
# PYTHONPATH; session 24's first A/B ran this checkout's code in both arms so. Set for both arms alike.
export PYTHONSAFEPATH=1
export PYTHONPATH="${CODE:+$PWD/$CODE:}$PWD:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
python3 -c "import evalparity, os; print('evalparity from', os.path.dirname(evalparity.__file__))"
mkdir -p "$EVALPARITY_CACHE/wheels"
cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null || true
