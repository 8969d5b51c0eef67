"""Two runs' per-sample tables, cell by cell: how many rows are bit-identical (every loglikelihood, is_greedy
and metric), and the largest |Δ loglikelihood| where not. Usage: compare_tables.py RUN_A RUN_B.

For a switch that should change no number (e.g. ``--mps``): the same command with and without it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from evalparity import samples


def main(a: Path, b: Path) -> int:
    worst = 0
    for cell_dir in sorted((a / "cells").iterdir()):
        other = b / "cells" / cell_dir.name / "samples.parquet"
        if not other.exists():
            print(f"{cell_dir.name}: not in {b}")
            continue
        ta = samples.read_table(cell_dir / "samples.parquet").sort_values(samples.KEY).reset_index(drop=True)
        tb = samples.read_table(other).sort_values(samples.KEY).reset_index(drop=True)
        if len(ta) != len(tb) or not ta[samples.KEY].equals(tb[samples.KEY]):
            print(f"{cell_dir.name}: different rows ({len(ta)} against {len(tb)})")
            worst = 1
            continue
        cols = ["loglikelihood", "is_greedy"] + samples.metric_columns(ta)
        same = np.ones(len(ta), dtype=bool)
        for c in cols:
            if c in ta and c in tb:
                x, y = ta[c].to_numpy(), tb[c].to_numpy()
                same &= (x == y) | (ta[c].isna().to_numpy() & tb[c].isna().to_numpy())
        ll = np.abs(ta["loglikelihood"].to_numpy(dtype=float) - tb["loglikelihood"].to_numpy(dtype=float))
        print(f"{cell_dir.name}: {int(same.sum()):,} of {len(ta):,} rows bit-identical; max |Δ ll| {np.nanmax(ll):.3g}")
        worst = max(worst, int(not same.all()))
    return worst


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
