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
    """A PNG under ``report/figures/``: linked from report.md, embedded in report.html (self-contained)."""

    alt: str
    rel: str  # the path relative to report.md, e.g. "figures/score_differences.png"
    png_base64: str


@dataclass(frozen=True)
class SignOff:
    """The headline: PASS, FAIL, INCONCLUSIVE or INCOMPLETE, why, and the cells that could not be used."""

    status: str
    reason: str
    incomplete: list[tuple[str, str]] = field(default_factory=list)  # (cell, why)
    not_compared: list[tuple[str, str]] = field(default_factory=list)  # (task, the cells it is missing from)
    staged: list[tuple[str, str]] = field(default_factory=list)  # a staged run: (task, where it stopped and why)
    staged_off: str | None = None  # a staged run whose rule was off: why every task was scored to its end


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
class Fold:
    """A group's member tasks, folded under the group's row, whose pooled verdict is the one that gates."""

    group: str
    n_members: int
    table: Table


@dataclass(frozen=True)
class VerdictMatrix:
    """Tasks x cells: groups and standalone tasks first, each group's members folded."""

    table: Table
    folds: list[Fold]
    noise_marked: bool  # the run has a noise floor: cells say +noise / ≤noise


@dataclass(frozen=True)
class SettingDifference:
    """A setting whose value differs between cells: a setup difference, not drift."""

    key: str
    values: str  # the distinct values, comma-separated


@dataclass(frozen=True)
class Setup:
    """The run's settings, each cell's environment, and the cells' effective settings side by side."""

    run: Table
    cells: Table
    differences: list[SettingDifference]
    settings: Table | None  # None: no cell recorded its settings (imported lm-eval outputs)
    environment: Table | None = None  # what each cell ran on (hostenv); None: no cell recorded it


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
    paired: Table  # the gating comparisons
    figures: list[Figure]
    deltas: Table | None  # loglikelihood drift per request
    flips: Table | None  # decision flips, observed against expected
    generations: Table | None
    noise_floor: Table | None  # None: no repeat or TF32 cell (the section says how to add one)
    drift: Drift | None
    flipped_samples: list[str] | None  # None: no flipped samples table; [] none of them across backends
