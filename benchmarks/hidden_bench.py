"""Hidden states of three layers (last token) for N prompts, three ways, on the same prompts (issue 28 item 3):

1. ``generate``: HF ``model.generate(..., max_new_tokens=1, output_hidden_states=True,
   return_dict_in_generate=True)`` one prompt at a time, the way users do it today. For N > 500 only the
   first 500 prompts are timed (``--one-at-a-time-max``) and the rest extrapolated (the output says so).
2. ``batched``: the HF batched forward a user writes: the prompts in their order, ``--user-batch`` (64) at a time,
   left-padded by the tokenizer, ``model(**batch, output_hidden_states=True)`` (LM head included), the last
   position of each row.
   ``hf``: ``evalparity hidden --backend hf`` (the HF probe: length-sorted padded batches, no LM head).
3. ``vllm``: ``evalparity hidden --backend vllm`` (the vLLM probe: hooks through ``LLM.apply_model``, one
   scheduler step per call), with the vLLM cell's environment set before vLLM is imported (the command's
   own worker process; ``drift.launch_plan``).

Routes ``hf`` and ``vllm`` run as ``evalparity hidden`` processes with ``--check 0``; their figures are read
from ``hidden.json`` (load, encode, forward, write). Routes ``generate`` and ``batched`` run as a user's script
does: each in a fresh Python process of its own (this file, ``--child ROUTE``), which imports torch and
transformers, loads, runs and hands its tensors back in a file. So every route has a **process wall**: from
the interpreter's start to its end, imports, CUDA's start and the model's load included (for ``generate``,
its untimed prompts' share added at the timed rate). Its "load" figures are each route's own and are not
alike: the user's routes start their clock after their imports, ``evalparity hidden`` before lm-eval's and
the backend's. Prints prompts/s per route (forward only, end to end with the load, and by the process wall),
the speedups, and how far route 1's tensors are from route 3's and route 2's (a figure, not a test: bf16
differs between kernels). No asserts.

    python benchmarks/hidden_bench.py --model /models/SmolLM2-135M-Instruct --device cuda --n-prompts 10000 \\
        --datasets-dir /work/shared/data                # HellaSwag validation contexts + endings
    python benchmarks/hidden_bench.py --model M --prompts prompts.txt --n-prompts 50 --device cpu --dtype fp32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELLASWAG = Path("Rowan/hellaswag/default/validation.jsonl")


def load_prompts(args) -> list[str]:
    """``--n-prompts`` distinct prompts: lines of ``--prompts``, or HellaSwag validation rows from
    ``--datasets-dir`` as lm-eval scores them (context + ending, each row's four endings in turn)."""
    if args.prompts:
        texts = [x for x in Path(args.prompts).read_text().splitlines() if x.strip()]
    else:
        path = Path(args.datasets_dir) / HELLASWAG
        texts = []
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for k in range(4):  # every row's first ending, then every row's second, ...: distinct, as many as asked
            texts += [f"{r['activity_label']}: {r['ctx']} {r['endings'][k]}" for r in rows]
            if len(texts) >= args.n_prompts:
                break
    texts = [" ".join(t.split()) for t in texts]  # one line each
    seen: dict[str, None] = dict.fromkeys(texts)
    texts = list(seen)[:args.n_prompts]
    if len(texts) < args.n_prompts:
        print(f"note: only {len(texts)} distinct prompts available (asked {args.n_prompts})")
    return texts


def default_layers(model: Path) -> list[int]:
    """Three entries: a third and two thirds of the way up, and the final norm's output."""
    n = int(json.loads((model / "config.json").read_text())["num_hidden_layers"])
    return sorted({max(1, n // 3), max(1, 2 * n // 3)}) + [-1]


def route_generate(args, texts: list[str], layers: list[int]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def one(text: str) -> list:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=args.max_length).to(device)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=1, do_sample=False, output_hidden_states=True,
                                 return_dict_in_generate=True, pad_token_id=pad)
        first = out.hidden_states[0]  # the prompt's forward pass: embeddings, each layer, the final norm's output
        return [first[e][0, -1].float().cpu() for e in layers]

    one(texts[0])  # warm-up (kernels, caches), counted with the load
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    n = min(len(texts), args.one_at_a_time_max)
    t1 = time.perf_counter()
    rows = [one(t) for t in texts[:n]]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    timed = time.perf_counter() - t1
    forward_s = timed * len(texts) / n
    hidden = {e: torch.stack([r[k] for r in rows]) for k, e in enumerate(layers)}
    return {"load_s": load_s, "forward_s": forward_s, "timed": n, "timed_s": timed, "extrapolated": n < len(texts),
            "hidden": hidden, "device": device}


def route_batched(args, texts: list[str], layers: list[int]) -> dict:
    """HF's batched forward as a user writes it (the issue's "HF batched forward"): no sorting, fixed batches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()

    def batch(part: list[str]) -> list:
        enc = tok(part, return_tensors="pt", padding=True, truncation=True, max_length=args.max_length).to(device)
        with torch.no_grad():
            hs = model(**enc, output_hidden_states=True).hidden_states
        return [hs[e][:, -1].float().cpu() for e in layers]

    batch(texts[:args.user_batch])  # warm-up, counted with the load
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    parts = [batch(texts[i:i + args.user_batch]) for i in range(0, len(texts), args.user_batch)]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    hidden = {e: torch.cat([p[k] for p in parts]) for k, e in enumerate(layers)}
    return {"load_s": load_s, "forward_s": time.perf_counter() - t1, "hidden": hidden, "device": device}


def route_fresh(args, route: str, prompts: Path, out: Path, layers: list[int]) -> dict:
    """Route ``generate`` or ``batched`` in a fresh process (``--child``), as a user's script runs: its
    figures, its tensors, and the process's wall from start to end (``generate``: with the share of the
    prompts it did not time, at its timed rate)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--child", route, "--model", str(args.model), "--prompts", str(prompts),
           "--n-prompts", str(args.n_prompts), "--device", args.device, "--dtype", args.dtype,
           "--layers", ",".join(map(str, layers)), "--max-length", str(args.max_length),
           "--one-at-a-time-max", str(args.one_at_a_time_max), "--user-batch", str(args.user_batch),
           "--keep", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"{route}: its process failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return {}
    got = torch.load(out / "route.pt")
    return {**got, "wall_s": wall - got.get("timed_s", got["forward_s"]) + got["forward_s"]}


def child(args, texts: list[str], layers: list[int]) -> None:
    """``--child ROUTE``: one user route, its result saved to ``--keep``/route.pt for the parent."""
    import torch

    got = (route_generate if args.child == "generate" else route_batched)(args, texts, layers)
    torch.save(got, args.keep / "route.pt")


def route_hidden(args, backend: str, prompts: Path, out: Path, layers: list[int]) -> dict:
    if (out / "hidden.json").exists():  # evalparity hidden would find it finished and time nothing
        sys.exit(f"{out} holds a finished {backend} route: give the bench another --keep")
    cmd = [sys.executable, "-m", "evalparity.cli", "hidden", "--model", str(args.model), "--prompts", str(prompts),
           "--layers", ",".join(map(str, layers)), "--backend", backend, "--dtype", args.dtype,
           "--device", args.device, "--max-length", str(args.max_length), "--check", "0", "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"TTY_INTERACTIVE": "0"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"{backend}: evalparity hidden failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return {}
    record = json.loads((out / "hidden.json").read_text())
    from safetensors.torch import load_file

    t = load_file(str(out / "hidden.safetensors"))
    hidden = {a: t[f"layer.{record['entry_of_layer'][str(a)]}"] for a in layers}
    return {**record["timings"], "wall_s": wall, "hidden": hidden, "device": record["device"],
            "n_unique": record["n_unique"]}


def rel(a, b) -> float:
    return float((b.double() - a.double()).norm() / a.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="local model folder")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help=".txt file, one prompt a line")
    src.add_argument("--datasets-dir", help="dataset mirror holding Rowan/hellaswag/default/validation.jsonl")
    ap.add_argument("--n-prompts", type=int, default=1000)
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--layers", default=None, help="three entries, e.g. 10,20,-1 (default: 1/3, 2/3 and -1)")
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--one-at-a-time-max", type=int, default=500,
                    help="prompts timed on route 1 (the rest extrapolated)")
    ap.add_argument("--routes", default="generate,batched,hf,vllm")
    ap.add_argument("--user-batch", type=int, default=64, help="route 2's batch size (prompts)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the routes' output folders here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # route_fresh's own process
    args = ap.parse_args()
    texts = load_prompts(args)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else default_layers(args.model)
    if args.child:
        child(args, texts, layers)
        return
    routes = args.routes.split(",")
    if len(set(routes)) < len(routes):  # a route's second time would find its folder finished and do nothing
        ap.error(f"--routes {args.routes} names a route twice: run the bench again (another --keep) instead")
    work = Path(tempfile.mkdtemp(prefix="hidden-bench-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(texts) + "\n")
    print(f"{len(texts)} prompts, layers {','.join(map(str, layers))}, last token, {args.dtype}, device {args.device}, "
          f"model {args.model}")
    got: dict[str, dict] = {}
    for route in routes:
        if route in ("generate", "batched"):
            got[route] = route_fresh(args, route, prompts, work / route, layers)
        else:
            got[route] = route_hidden(args, route, prompts, work / route, layers)
        r = got[route]
        if not r:
            continue
        n = len(texts)
        note = (f" (timed {r['timed']} prompts, extrapolated to {n})" if r.get("extrapolated") else "")
        wall = f", process wall {r['wall_s']:.1f} s ({n / r['wall_s']:.1f} prompts/s)"
        print(f"{route:9s} {n / r['forward_s']:10.1f} prompts/s forward{note}; load {r['load_s']:.1f} s, forward "
              f"{r['forward_s']:.1f} s, end to end {n / (r['load_s'] + r['forward_s']):.1f} prompts/s"
              f"{wall} [{r['device']}]")
    ok = {k: v for k, v in got.items() if v}
    if "generate" in ok:
        base = ok["generate"]["forward_s"]
        for k in ("batched", "hf", "vllm"):
            if k in ok:
                print(f"speedup {k} over generate one at a time: {base / ok[k]['forward_s']:.1f}x forward, "
                      f"{(base + ok['generate']['load_s']) / (ok[k]['forward_s'] + ok[k]['load_s']):.1f}x with load, "
                      f"{ok['generate']['wall_s'] / ok[k]['wall_s']:.1f}x by process wall")
    for k in ("hf", "vllm"):
        for base in ("batched", "hf"):
            if k != base and k in ok and base in ok:
                a, b = ok[base], ok[k]
                print(f"speedup evalparity hidden --backend {k} over {base}: {a['forward_s'] / b['forward_s']:.2f}x "
                      f"forward, {(a['forward_s'] + a['load_s']) / (b['forward_s'] + b['load_s']):.2f}x with load, "
                      f"{a['wall_s'] / b['wall_s']:.2f}x by process wall")
    for a, b in (("generate", "vllm"), ("generate", "hf"), ("batched", "hf"), ("hf", "vllm")):
        if a in ok and b in ok:
            m = min(len(ok[a]["hidden"][layers[0]]), len(ok[b]["hidden"][layers[0]]))
            errs = ", ".join(f"{e}: {rel(ok[a]['hidden'][e][:m], ok[b]['hidden'][e][:m]):.1e}" for e in layers)
            print(f"rel error {a} vs {b} on {m} prompts, per layer: {errs}")
    print(f"outputs: {work}")


if __name__ == "__main__":
    main()
