"""GPU side (issue 28): where ``evalparity hidden --backend hf``'s load goes (cProfile of the worker's
``load_side``, the side planned as the command plans it), printed by cumulative time."""
import cProfile
import os
import pstats
import sys
import time

from evalparity.drift import launch_plan

model, device = sys.argv[1], sys.argv[2]
launch = launch_plan(model, ["hf-bf16"], "hf-bf16", device=device, max_len=2048)
os.environ.update(launch["hf-bf16"]["env"])
t0 = time.perf_counter()
import torch  # noqa: E402, F401 (timed: the import is the figure)

print(f"import torch {time.perf_counter() - t0:.2f} s")
from evalparity.drift.worker import load_side  # noqa: E402

t = time.perf_counter()
pr = cProfile.Profile()
pr.enable()
probe = load_side({"launch": launch}, "hf-bf16")
pr.disable()
print(f"load_side {time.perf_counter() - t:.2f} s")
pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
