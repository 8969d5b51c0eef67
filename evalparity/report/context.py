"""The report context: everything the two templates show, as plain data, already formatted.

``build.build_context`` fills it from ``stats/``, ``cells/*/cell.json``, ``spec.json`` and ``drift/``;
``templates/report.md`` and ``templates/report.html`` lay it out. Values are strings formatted once here
(``formatting``), so the markdown and the HTML report cannot print a number differently; the templates
escape them for their format. One field per section: adding a section is a field here, its builder in
``sections`` and one block in each template. A section that is ``None`` is left out of both reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Table:
    """A table with every cell already text."""

    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    """A PNG under ``report/figures/``: embedded in report.html (self-contained), named in report.md (a PR
    comment or a step summary cannot show a relative image, so report.md says where the figures are)."""

    alt: str  # its caption, also the image's alternative text
    rel: str  # the path relative to report.md, e.g. "figures/score_differences.png"
    png_base64: str


@dataclass(frozen=True)
class SignOff:
    """The headline: PASS, FAIL, INCONCLUSIVE or INCOMPLETE, why, what to do next, and the cells that could not
    be used."""

    status: str
    reason: str
    incomplete: list[tuple[str, str]] = field(default_factory=list)  # (cell, why)
    not_compared: list[tuple[str, str]] = field(default_factory=list)  # (task, the cells it is missing from)
    staged: list[tuple[str, str]] = field(default_factory=list)  # a staged run: (task, where it stopped and why)
    staged_off: str | None = None  # a staged run whose rule was off: why every task was scored to its end
    counts: list[tuple[str, int]] = field(default_factory=list)  # gating comparisons per verdict (those with any)
    next_step: str | None = None  # e.g. the docs that would settle the unsettled comparisons; None for a PASS


@dataclass(frozen=True)
class Method:
    """The numbers of the paragraph that says how verdicts are decided (the run's statistics options)."""

    reference: str
    worse: bool  # --direction worse: the margin is a drop, not ±
    margin: str  # in percentage points
    metric_margins: list[tuple[str, str]]  # (metric, margin in its own unit)
    ll_tolerance: str
    ci_percent: str  # the TOST interval, 100 (1 - 2 alpha)
    alpha: str
    multiple: str  # the family adjustment: holm, bh or none


@dataclass(frozen=True)
class MatrixCell:
    """One task x cell of the verdict matrix: the verdict and what it was decided on, each part its own line
    in report.html."""

    verdict: str
    delta: str  # the difference and the bounds of its interval: "+0.00 pp [-7.22, +7.22]"
    n: str  # the docs compared and the interval's level: "n = 6 · 90% CI"
    noise: str = ""  # in a run with a noise floor: "+noise" or "≤noise"

    @property
    def parts(self) -> list[str]:
        return [x for x in (self.verdict, self.delta, self.n, self.noise) if x]

    @property
    def text(self) -> str:
        """The cell on one line, as report.md shows it."""
        return " ".join(self.parts)


@dataclass(frozen=True)
class MatrixRow:
    task: str
    metric: str  # with its filter when it has one: "exact_match (strict-match)"
    cells: list[MatrixCell | None]  # None: no comparison of this task in that cell


@dataclass(frozen=True)
class Matrix:
    cells: list[str]  # the column heads after task and metric
    rows: list[MatrixRow]


@dataclass(frozen=True)
class Fold:
    """A group's member tasks, folded under the group's row, whose pooled verdict is the one that gates."""

    group: str
    n_members: int
    table: Matrix


@dataclass(frozen=True)
class LegendEntry:
    verdict: str
    meaning: str


@dataclass(frozen=True)
class VerdictMatrix:
    """Tasks x cells: groups and standalone tasks first, each group's members folded. A ``--compare A:B``
    pair is a column of its own, ``B vs A``."""

    table: Matrix
    folds: list[Fold]
    noise_marked: bool  # the run has a noise floor: cells say +noise / ≤noise
    legend: list[LegendEntry]  # every verdict the report can show, what it means
    changes: list[tuple[str, str]] = field(default_factory=list)  # (column, what its cell changes), where any
    pairs: bool = False  # some columns are --compare pairs (B vs A), not cells against the reference


@dataclass(frozen=True)
class PairedRow:
    """One gating comparison: what was compared, the estimate, its interval and tests, the verdict and why."""

    task: str
    metric: str
    cell: str
    n: str
    scores: str  # "reference → cell"
    delta: str
    ci: str  # the verdict's interval, with its level
    p_equivalence: str
    p_beyond: str
    p_change: str
    beyond_noise: str
    verdict: str
    reason: str
    changes: str = ""  # "changes: quantization=fp8": what the cell changes against its reference; "" nothing


@dataclass(frozen=True)
class Paired:
    """The gating comparisons; report.html gives each its reason as a full-width row under it, report.md as
    a list after its narrow tables."""

    rows: list[PairedRow]
    noise_marked: bool  # a beyond-noise column only where the run has a noise floor


@dataclass(frozen=True)
class SettingDifference:
    """A setting whose value differs between cells: a setup difference, not drift."""

    key: str
    values: str  # the distinct values, comma-separated


@dataclass(frozen=True)
class SideBySide:
    """Per-cell records (settings or environment) as two tables: what every cell shares, once, and what
    differs, cell by cell; keys that no cell set (``None`` everywhere, such as GPU settings on a CPU run) are
    named, not shown as rows of ``None``."""

    shared: Table | None
    differing: Table | None
    unset: list[str]


@dataclass(frozen=True)
class Setup:
    """The run's settings, each cell's environment, and the cells' effective settings side by side."""

    run: Table
    cells: Table
    differences: list[SettingDifference]
    settings: SideBySide | None  # None: no cell recorded its settings (imported lm-eval outputs)
    environment: SideBySide | None = None  # what each cell ran on (hostenv); None: no cell recorded it


@dataclass(frozen=True)
class Compared:
    """Each pair of compared cells: what the cell changes against its reference (its backend, dtype and
    variant settings), the software versions that differ between the two, and, for a cell not made in this
    run (``reused_from`` in its record), where and when it was made."""

    table: Table
    reused: list[str]  # one sentence per reused cell


@dataclass(frozen=True)
class WorstTokens:
    """The tokens whose logprob moved most in one drift cell, as preformatted lines."""

    cell: str
    text: str


@dataclass(frozen=True)
class Drift:
    """``evalparity drift``: where in the network the cells part, from ``drift/*.json``."""

    n_prompts: str
    reference: str
    threshold: str
    table: Table
    figures: list[Figure]
    worst: list[WorstTokens]


@dataclass(frozen=True)
class ReportContext:
    """The whole report, section by section in reading order."""

    model: str
    sign_off: SignOff
    method: Method
    verdicts: VerdictMatrix | None  # None: no score comparisons
    setup: Setup
    paired: Paired  # the gating comparisons
    compared: Compared | None  # None: no comparisons
    figures: list[Figure]
    deltas: Table | None  # loglikelihood drift per request
    flips: Table | None  # decision flips, observed against expected
    generations: Table | None
    noise_floor: Table | None  # None: no repeat or TF32 cell (the section says how to add one)
    drift: Drift | None
    flipped_samples: list[str] | None  # None: no flipped samples table; [] none of them across backends
