"""Two runs' per-sample tables, cell by cell: how many rows are bit-identical (every loglikelihood, is_greedy
and metric), and the largest |Δ loglikelihood| where not. Usage: compare_tables.py RUN_A RUN_B.

For a switch that should change no number (e.g. ``--mps``): the same command with and without it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from evalparity import samples


def main(a: Path, b: Path) -> int:
    """0 when both runs hold the same cells and every row of every cell is bit-identical, else 1."""
    worst = 0
    names_a = {d.name for d in (a / "cells").iterdir()}
    names_b = {d.name for d in (b / "cells").iterdir()}
    for name in sorted(names_a ^ names_b):
        print(f"{name}: only in {a if name in names_a else b}")
        worst = 1
    for cell_dir in sorted((a / "cells" / n) for n in names_a & names_b):
        other = b / "cells" / cell_dir.name / "samples.parquet"
        ta = samples.read_table(cell_dir / "samples.parquet").sort_values(samples.KEY).reset_index(drop=True)
        tb = samples.read_table(other).sort_values(samples.KEY).reset_index(drop=True)
        if len(ta) != len(tb) or not ta[samples.KEY].equals(tb[samples.KEY]):
            print(f"{cell_dir.name}: different rows ({len(ta)} against {len(tb)})")
            worst = 1
            continue
        cols = sorted(set(["loglikelihood", "is_greedy"] + samples.metric_columns(ta) + samples.metric_columns(tb)))
        missing = [c for c in cols if (c in ta) != (c in tb)]
        if missing:
            print(f"{cell_dir.name}: column(s) {missing} in one table only")
            worst = 1
            continue
        same = np.ones(len(ta), dtype=bool)
        for c in (c for c in cols if c in ta):
            x, y = ta[c].to_numpy(), tb[c].to_numpy()
            same &= (x == y) | (ta[c].isna().to_numpy() & tb[c].isna().to_numpy())
        ll = np.abs(ta["loglikelihood"].to_numpy(dtype=float) - tb["loglikelihood"].to_numpy(dtype=float))
        print(f"{cell_dir.name}: {int(same.sum()):,} of {len(ta):,} rows bit-identical; max |Δ ll| {np.nanmax(ll):.3g}")
        worst = max(worst, int(not same.all()))
    return worst


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
