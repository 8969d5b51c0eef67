# Sourced by the GPU-side scripts (issue28_run.sh, jit_kernels.sh): prompts N FILE writes N prompts of HellaSwag
# validation from .gpudata (context + first ending, one a line; repeated from the start where N is more).
prompts() {
  python3 - "$1" "$2" <<'PY'
import json, sys
n, out = int(sys.argv[1]), sys.argv[2]
rows = [json.loads(x) for x in open(".gpudata/Rowan/hellaswag/default/validation.jsonl")]
texts = [(r["ctx"] + " " + r["endings"][0]).replace("\n", " ") for r in rows]
texts = (texts * (n // len(texts) + 1))[:n] if n > len(texts) else texts[:n]
open(out, "w").write("\n".join(texts) + "\n")
PY
}
