"""GPU side (issue 28): what writing one drift reference chunk costs, step by step, and what starting CUDA
costs beside transformers' imports. Prints figures; asserts nothing.

    python3 scripts/gpu/write_probe.py chunk DIR     # a 2 GiB chunk (31 entries x 30,000 tokens x 576, fp32)
    python3 scripts/gpu/write_probe.py start serial|thread   # in a fresh process each
"""

from __future__ import annotations

import sys
import time

t_start = time.perf_counter()
import torch  # noqa: E402

t_torch = time.perf_counter() - t_start


def chunk(folder: str) -> None:
    import threading
    from importlib.metadata import version

    from safetensors.torch import save_file

    print(f"safetensors {version('safetensors')}, torch {torch.__version__}")
    torch.zeros(1, device="cuda")
    gpu = [{f"entry.{e}": torch.randn(30000, 576, device="cuda") for e in range(31)} for _ in range(3)]
    gib = sum(v.numel() * 4 for v in gpu[0].values()) / 2**30
    torch.cuda.synchronize()
    for k in range(2):
        t = time.perf_counter()
        host = {n: v.cpu() for n, v in gpu[k].items()}
        d2h = time.perf_counter() - t
        t = time.perf_counter()
        save_file(host, f"{folder}/sync-{k}.safetensors")
        print(f"chunk {gib:.2f} GiB, pass {k}: .cpu() {d2h:.2f} s, save_file {time.perf_counter() - t:.2f} s")
    for k in range(2):
        t = time.perf_counter()
        pinned = {n: v.to("cpu", non_blocking=True) for n, v in gpu[k].items()}
        queued = time.perf_counter() - t
        torch.cuda.synchronize()
        print(f"pinned non-blocking copy, pass {k}: queued in {queued:.3f} s, done after "
              f"{time.perf_counter() - t:.2f} s (pinned: {next(iter(pinned.values())).is_pinned()})")
    hosts = [{n: v.cpu() for n, v in g.items()} for g in gpu]
    t = time.perf_counter()
    threads = [threading.Thread(target=save_file, args=(h, f"{folder}/par-{k}.safetensors"))
               for k, h in enumerate(hosts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print(f"3 chunks written by 3 threads at once: {time.perf_counter() - t:.2f} s ({3 * gib:.1f} GiB)")


def start(how: str) -> None:
    from evalparity import slim

    slim.apply()
    t = time.perf_counter()
    th = None
    if how == "thread":  # what session 29's devices.start_cuda did (removed in session 30: no gain measured)
        import threading

        th = threading.Thread(target=torch.zeros, args=(1,), kwargs={"device": "cuda"}, daemon=True)
        th.start()
    import lm_eval.models.huggingface  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401

    imports = time.perf_counter() - t
    if th is not None:
        th.join()
    else:
        torch.zeros(1, device="cuda")
    print(f"start {how}: torch {t_torch:.2f} s, imports {imports:.2f} s, imports and CUDA up "
          f"{time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    chunk(sys.argv[2]) if sys.argv[1] == "chunk" else start(sys.argv[2])
