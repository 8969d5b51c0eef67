# runner.sh: `source scripts/gpu/runner.sh` on the device, after .gpu/bin/env.sh. RUNNER picks vLLM's GPU model
# runner. The recipe's env.sh sets VLLM_USE_V2_MODEL_RUNNER=0 (V1), which no user's machine sets; "vllm" (the
# default since session 26) unsets it, so that vLLM chooses as it does for a user (in 0.26, V2 for dense
# decoders); "v1" / "v2" force one. Each vLLM cell records the runner it got (settings.model_runner).
case ${RUNNER:-vllm} in
  vllm) unset VLLM_USE_V2_MODEL_RUNNER ;;
  v1) export VLLM_USE_V2_MODEL_RUNNER=0 ;;
  v2) export VLLM_USE_V2_MODEL_RUNNER=1 ;;
  *) echo "RUNNER must be vllm, v1 or v2"; exit 2 ;;
esac
