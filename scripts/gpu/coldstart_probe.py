"""Where a packed cell's start goes on the GPU machine (issue 26, item 5): K engines starting at once.

Run on the device after ../shared/gpu's install (``source .gpu/bin/env.sh``), with a prepared model folder:
    python3 scripts/gpu/coldstart_probe.py --model DIR --vllm 3 --hf 3 [--stagger S] --label L --out OUT
Each engine is a child process that prints when it reaches each step (seconds since the parent started
all children): python up, ``import torch``, CUDA initialised, ``import vllm`` / ``transformers``, the engine
built (``LLM()`` / ``from_pretrained`` + ``.to(cuda)``), then 200 prompts scored (prompt logprobs / one
forward each batch). The parent writes every child's steps to OUT/<label>.json and prints a table.
Not a test: a measurement script whose figures go into results/ with the conditions they were taken under.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = [f"The quick brown fox number {i} jumps over the lazy dog and then " * 4 for i in range(200)]


def child(kind: str, model: str, dtype: str, t0: float) -> None:
    def mark(step: str) -> None:
        print(json.dumps({"step": step, "t": round(time.time() - t0, 2)}), flush=True)

    mark("python")
    import torch
    mark("import torch")
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    mark("cuda ready")
    if kind == "vllm":
        import vllm
        mark("import vllm")
        llm = vllm.LLM(model=model, dtype=dtype, enforce_eager=True, gpu_memory_utilization=0.08,
                       kv_cache_memory_bytes=2 << 30, max_model_len=2048, seed=1234)
        mark("engine built")
        sp = vllm.SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False)
        llm.generate(PROMPTS, sp, use_tqdm=False)
        mark("scored")
    else:
        import transformers
        mark("import transformers")
        m = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to("cuda")
        tok = transformers.AutoTokenizer.from_pretrained(model)
        mark("engine built")
        with torch.no_grad():
            for i in range(0, len(PROMPTS), 32):
                enc = tok(PROMPTS[i:i + 32], return_tensors="pt", padding=True).to("cuda")
                m(**enc).logits.float().log_softmax(-1)
        torch.cuda.synchronize()
        mark("scored")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=4, metavar=("KIND", "MODEL", "DTYPE", "T0"))
    ap.add_argument("--model")
    ap.add_argument("--vllm", type=int, default=0)
    ap.add_argument("--hf", type=int, default=0)
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between starts")
    ap.add_argument("--label", default="probe")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.child[2], float(a.child[3]))
        return
    dtypes = ["float32", "bfloat16", "float16"]
    kinds = [("vllm", dtypes[i % 3]) for i in range(a.vllm)] + [("hf", dtypes[i % 3]) for i in range(a.hf)]
    t0 = time.time()
    procs = []
    for i, (kind, dtype) in enumerate(kinds):
        if i and a.stagger:
            time.sleep(a.stagger)
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        procs.append((kind, dtype, subprocess.Popen([sys.executable, __file__, "--child", kind, a.model, dtype,
                                                     str(t0)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                    env=env, text=True)))
    rows = []
    for kind, dtype, p in procs:
        out, _ = p.communicate()
        steps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        rows.append({"kind": kind, "dtype": dtype, "rc": p.returncode, "steps": steps})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"{a.label}.json"), "w") as f:
        json.dump({"label": a.label, "vllm": a.vllm, "hf": a.hf, "stagger": a.stagger, "rows": rows}, f, indent=1)
    print(f"== {a.label}: {a.vllm} vLLM + {a.hf} HF, stagger {a.stagger} s, total {time.time() - t0:.1f} s")
    for r in rows:
        print(f"{r['kind']:5} {r['dtype']:9} rc={r['rc']} " + "  ".join(f"{s['step']}@{s['t']}" for s in r["steps"]))


if __name__ == "__main__":
    main()
