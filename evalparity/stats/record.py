"""One comparison record: the row that ``stats/comparisons.parquet``, ``verdicts.json`` and the report read.

Built in one place (``compare``), so every reader sees the same fields under the same names. The schema of
``verdicts.json`` is versioned (``SCHEMA``) and documented in the README; bump it when a field changes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

SCHEMA = "evalparity.verdicts/4"


@dataclass
class Comparison:
    """One task (or group) × filter × metric × cell against its reference.

    ``effect`` is the estimate of ``estimand`` in ``unit`` ("pp": a difference of proportions, stored as a
    fraction; "nats"; "": the metric's own unit). ``ci_low``/``ci_high`` at ``ci_level`` is the interval the
    verdict was decided on (see ``verdict``). ``margin_low``/``margin_high`` is the acceptable region (one
    end may be infinite; None when the metric has no margin).
    """

    id: int
    kind: str  # cross | pair (--compare A:B) | noise_floor | precision_mode
    task: str
    group: str
    level: str  # task | group
    filter: str
    metric: str
    cell: str
    reference: str
    estimand: str
    unit: str
    n: int
    reference_score: float
    cell_score: float
    effect: float
    ci_low: float
    ci_high: float
    ci_level: float
    margin: float | None
    margin_low: float | None
    margin_high: float | None
    direction: str
    p_equivalence: float
    p_beyond: float
    p_beyond_adjusted: float
    p_shift: float
    p_shift_adjusted: float
    shift_test: str
    method: str
    verdict: str  # EQUIVALENT | DIFFERENT | SHIFT | INCONCLUSIVE | NO MARGIN | "" (noise floor: no verdict)
    reason: str
    gating: bool
    n_nonfinite_reference: int = 0
    n_nonfinite_cell: int = 0
    n_nonfinite_both: int = 0
    discordant: int | None = None
    reference_only: int | None = None
    cell_only: int | None = None
    mdd: float | None = None
    n_needed: float | None = None
    noise_floor_pair: str | None = None  # "base vs repeat" whose run-to-run discordance is the yardstick
    noise_discordance: float | None = None
    discordance_excess: float | None = None  # cross discordance − noise-floor discordance, on the same docs
    discordance_excess_ci: list[float] | None = None
    p_beyond_noise: float | None = None
    beyond_noise: bool | None = None
    staged_look: int | None = None   # a staged run: the look (1-based) at which the verdict was decided
    staged_looks: int | None = None  # and how many looks its task had
    # What the cell changes against its reference, in one line (``variants.difference`` of their cell.json
    # records: "vllm, bf16, quantization=fp8"); "" when neither sets anything the other does not
    differs: str = ""

    def to_json(self) -> dict:
        return {k: _clean(v) for k, v in asdict(self).items()}


def columns() -> list[str]:
    return [f.name for f in fields(Comparison)]


def _clean(x):
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
