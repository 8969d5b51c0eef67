"""A cell's evaluation against its bare engine on the same requests (issue 19, item 6).

For each backend asked, side by side in one process tree:
1. **bare**: the task's loglikelihood requests, built by lm-eval (``TaskManager``, ``build_all_requests``),
   tokenised in one batched call (the pairs lm-eval's ``_encode_pair`` makes), and scored directly:
   - hf: ``AutoModelForCausalLM`` forward passes over length-sorted batches (``--hf-batch`` sequences),
     log-softmax in fp32 on the continuation positions only;
   - vllm: one ``LLM.generate`` over token-id prompts with ``prompt_logprobs=1``, ``max_tokens=1``,
     ``flat_logprobs=True``, ``detokenize=False`` (lm-eval's scoring parameters);
2. **cell**: ``evalparity run --backends B --dtypes D --single-cell`` on the same task, model and limit,
   alone on the device, and its ``cell.json`` phases (``evalparity/phases.py``).
It prints one table: bare request building, tokenising and engine seconds; the cell's phases; the ratio of
the cell's evaluation to the bare engine (tokenising + engine), which issue 19 wants within 1.3; and the
mean |Δ| between the bare engine's and the cell's per-request loglikelihoods (a check that both scored
the same thing; batch composition alone makes it non-zero).

    python benchmarks/bare_engine.py --model PATH --tasks hellaswag --datasets-dir DIR --device cuda \\
        --dtype fp32 --backends hf,vllm [--limit N] [--out DIR]

Only loglikelihood tasks are scored bare. Random-weight models are fine here: the work is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def build_requests(tasks: list[str], limit: int | None, datasets_dir: str | None, num_fewshot: int | None):
    """(task, doc_id, idx, context, continuation) for every loglikelihood request, as lm-eval builds them."""
    from evalparity.data import mirrors

    mirrors.activate(mirrors.mirror_roots(datasets_dir))
    from lm_eval.tasks import get_task_dict

    from evalparity import tasks as ep_tasks

    out = []
    task_dict = get_task_dict(tasks, ep_tasks.task_manager(()))

    def leaves(d):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v)
            else:
                yield k, v

    for name, task in leaves(task_dict):
        if num_fewshot is not None:
            task.set_config(key="num_fewshot", value=num_fewshot)
        task.build_all_requests(limit=limit, rank=0, world_size=1)
        for inst in task.instances:
            if inst.request_type == "loglikelihood":
                out.append((str(name), inst.doc_id, inst.idx, inst.args[0], inst.args[1]))
    return out


def encode(tokenizer, requests, add_bos: bool | None) -> list[tuple[list[int], list[int]]]:
    """lm-eval's causal ``_encode_pair`` for every request, with one batched tokenizer call (``add_bos``
    None: the tokenizer's own default, as evalparity's default ``--add-bos-token`` is)."""
    from evalparity.backends.pretokenize import request_strings, shift_spaces

    pairs = [(c, x) for _, _, _, c, x in requests]
    strings = request_strings(pairs)
    kw = {} if add_bos is None else {"add_special_tokens": add_bos}
    ids = dict(zip(strings, tokenizer(strings, **kw).input_ids))
    out = []
    for c, x in pairs:
        c, x = shift_spaces(c, x)
        whole = ids[c + x]
        ctx = ids[c] if c else tokenizer([c], **kw).input_ids[0]  # all-whitespace context: not in the batch
        out.append((ctx, whole[len(ctx):]))
    return out


def bare(args) -> dict:
    """Runs in a child process: build, tokenise, score; returns timings and per-request loglikelihoods."""
    t0 = time.perf_counter()
    reqs = build_requests(args.tasks.split(","), args.limit, args.datasets_dir, args.num_fewshot)
    t_req = time.perf_counter() - t0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    add_bos = None if args.add_bos is None else bool(args.add_bos)
    t1 = time.perf_counter()
    enc = encode(tok, reqs, add_bos)
    t_tok = time.perf_counter() - t1
    t2 = time.perf_counter()
    if args.one == "hf":
        lls, load = score_hf(args, enc)
    else:
        lls, load = score_vllm(args, enc)
    t_engine = time.perf_counter() - t2 - load
    return {"requests": len(reqs), "tokens": sum(len(c) + len(x) for c, x in enc), "requests_s": t_req,
            "tokenize_s": t_tok, "load_s": load, "engine_s": t_engine,
            "ll": {f"{t}|{d}|{i}": v for (t, d, i, _, _), v in zip(reqs, lls)}}


def score_hf(args, enc) -> tuple[list[float], float]:
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, DTYPES[args.dtype]),
                                                 attn_implementation="sdpa").to(dev).eval()
    load = time.perf_counter() - t0
    order = sorted(range(len(enc)), key=lambda i: -(len(enc[i][0]) + len(enc[i][1])))
    out = [0.0] * len(enc)
    with torch.inference_mode():
        for b in range(0, len(order), args.hf_batch):
            idx = order[b:b + args.hf_batch]
            seqs = [(enc[i][0] + enc[i][1])[-(args.max_length + 1):] for i in idx]
            width = max(len(s) for s in seqs) - 1
            inp = torch.zeros((len(idx), width), dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            target = torch.zeros((len(idx), width), dtype=torch.long)
            take = torch.zeros((len(idx), width), dtype=torch.bool)
            for r, (i, s) in enumerate(zip(idx, seqs)):
                n = len(s) - 1
                inp[r, :n] = torch.tensor(s[:-1])
                mask[r, :n] = 1
                target[r, :n] = torch.tensor(s[1:])
                k = len(enc[i][1])
                take[r, n - k:n] = True
            inp, mask, target, take = (t.to(dev) for t in (inp, mask, target, take))
            logits = model(input_ids=inp, attention_mask=mask).logits
            sel = logits[take].float().log_softmax(-1)
            ll = sel.gather(-1, target[take].unsqueeze(-1)).squeeze(-1)
            rows = take.nonzero()[:, 0]
            sums = torch.zeros(len(idx), device=dev, dtype=torch.float64).index_add_(0, rows, ll.double())
            for i, v in zip(idx, sums.tolist()):
                out[i] = v
    return out, load


def score_vllm(args, enc) -> tuple[list[float], float]:
    from vllm import LLM, SamplingParams, TokensPrompt

    t0 = time.perf_counter()
    kw = dict(model=args.model, dtype=DTYPES[args.dtype], enforce_eager=True, enable_prefix_caching=False,
              max_model_len=args.max_length, seed=1234)
    if args.device != "cpu":
        kw["gpu_memory_utilization"] = args.gpu_util
    llm = LLM(**kw)
    load = time.perf_counter() - t0
    sp = SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False, flat_logprobs=True)
    prompts = [TokensPrompt(prompt_token_ids=c + x) for c, x in enc]
    res = llm.generate(prompts, sampling_params=sp, use_tqdm=False)
    out = []
    for (c, x), r in zip(enc, res):
        lp = r.prompt_logprobs
        toks = c + x
        out.append(sum(lp[p][toks[p]].logprob for p in range(len(c), len(toks))))
    return out, load


def run_cell(args, backend: str, out: Path) -> dict:
    """The same requests through ``evalparity run``, one cell alone."""
    run = out / f"cell-{backend}"
    cmd = [sys.executable, "-m", "evalparity.cli", "run", "--model", args.model, "--tasks", args.tasks,
           "--backends", backend, "--dtypes", args.dtype, "--single-cell", "--device", args.device,
           "--out", str(run), "--force", "--no-fail-on-inconclusive"]
    for flag, val in (("--limit", args.limit), ("--datasets-dir", args.datasets_dir),
                      ("--num-fewshot", args.num_fewshot)):
        if val is not None:
            cmd += [flag, str(val)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    meta_path = run / "cells" / f"{backend}-{args.dtype}" / "cell.json"
    if not meta_path.exists():
        raise SystemExit(f"the {backend} cell did not finish: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    meta = json.loads(meta_path.read_text())
    import pandas as pd

    table = pd.read_parquet(meta_path.parent / "samples.parquet")
    ll = {f"{r.task}|{r.doc_id}|{r.choice}": r.loglikelihood for r in table.itertuples()
          if r.loglikelihood == r.loglikelihood}
    return {"run_wall_s": wall, "meta": meta, "ll": ll}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", default="hellaswag")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--num-fewshot", type=int, default=0)
    ap.add_argument("--datasets-dir")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--backends", default="hf,vllm")
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--gpu-util", type=float, default=0.5)
    ap.add_argument("--add-bos", type=int, help="1 or 0: as evalparity's --add-bos-token (default: the tokenizer's)")
    ap.add_argument("--out", type=Path, default=Path("bare-engine"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: score bare with this backend, print JSON
    args = ap.parse_args()
    if args.one:
        print("BARE " + json.dumps(bare(args)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for backend in args.backends.split(","):
        # the precision switches a true-fp32 cell sets (Triton's IEEE dots; vLLM's matmul precision), so
        # that bare and cell score at the same precision
        from evalparity.backends import precision

        env = dict(os.environ) | precision.environment(DTYPES[args.dtype], True)
        if backend == "vllm":
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            if args.device == "cpu":
                env["VLLM_TARGET_DEVICE"] = "cpu"
                env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", backend], capture_output=True,
                               text=True, env=env)
        line = next((ln for ln in child.stdout.splitlines() if ln.startswith("BARE ")), None)
        if line is None:
            raise SystemExit(f"bare {backend} failed: {child.stderr[-3000:]}")
        b = json.loads(line[5:])
        c = run_cell(args, backend, args.out)
        ph = c["meta"]["phases"]
        common = set(b["ll"]) & set(c["ll"])
        dll = sum(abs(b["ll"][k] - c["ll"][k]) for k in common) / max(len(common), 1)
        bare_work = b["tokenize_s"] + b["engine_s"]
        row = {"backend": backend, "dtype": args.dtype, "requests": b["requests"], "tokens": b["tokens"],
               "bare_requests_s": b["requests_s"], "bare_tokenize_s": b["tokenize_s"], "bare_load_s": b["load_s"],
               "bare_engine_s": b["engine_s"], "cell_eval_s": c["meta"]["eval_s"],
               **{f"cell_{k}": v for k, v in ph.items()},
               "cell_wall_s": c["meta"]["wall_s"], "run_wall_s": c["run_wall_s"],
               "ratio_eval_to_bare": c["meta"]["eval_s"] / bare_work,
               "ratio_scoring_to_bare": (ph["tokenize_s"] + ph["engine_s"]) / bare_work,
               "matched_requests": len(common), "mean_abs_dll": dll,
               "batched_tokenization": c["meta"]["settings"].get("batched_tokenization")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "bare_engine.json").write_text(json.dumps(rows, indent=2))
    keys = ("bare_tokenize_s", "bare_engine_s", "cell_requests_s", "cell_tokenize_s", "cell_engine_s",
            "cell_postprocess_s", "cell_eval_s", "ratio_eval_to_bare", "ratio_scoring_to_bare", "mean_abs_dll")
    print("| backend | requests | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for r in rows:
        print(f"| {r['backend']}-{r['dtype']} | {r['requests']} | "
              + " | ".join(f"{r[k]:.3g}" if k == "mean_abs_dll" else f"{r[k]:.1f}" if "_s" in k else f"{r[k]:.2f}"
                           for k in keys) + " |")


if __name__ == "__main__":
    main()
