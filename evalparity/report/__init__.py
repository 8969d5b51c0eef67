"""The report stage: reads ``stats/`` and ``cells/*/cell.json``, writes ``report/report.md``,
``report/report.html`` (self-contained: CSS inline, figures embedded as data URIs) and ``report/figures/``.

Sections, in the order a reviewer reads them: sign-off, why and the next step; the verdict matrix (tasks x
cells, each cell its verdict, Δ with its interval and n; group members folded under their group) with its
legend, and how verdicts are decided; the run's setup; the paired statistics per comparison, each with its
reason; figures; loglikelihood drift, flips and generations; the noise floor; where the drift comes from; the
most consequential flipped samples.

How it is built, one room per concern:

- ``build``: reads the run directory, draws the figures (``figures``) and fills the report context;
- ``sections``: one builder per section, statistics tables in, formatted rows out (``formatting``);
- ``context``: the context itself, plain dataclasses, one field per section;
- ``render``: the Jinja2 templates in ``templates/`` (``report.md``, ``report.html``, ``report.css``,
  ``self_check.js``), one block per section, markdown escaped by ``markdown``.
"""

from __future__ import annotations

from pathlib import Path

from evalparity.files import write_atomic
from evalparity.report.build import build_context, load_drift
from evalparity.report.formatting import TONES
from evalparity.report.markdown import md_escape, md_fence
from evalparity.report.render import render_html, render_markdown
from evalparity.rundir import layout

__all__ = ["TONES", "load_drift", "md_escape", "md_fence", "write_report"]


def write_report(run_dir: Path) -> dict[str, Path]:
    """Write the report of ``run_dir`` (after the statistics stage); returns the paths of report.md,
    report.html and the figures folder."""
    run_dir = Path(run_dir)
    out = layout.report_dir(run_dir)
    figdir = layout.figures_dir(run_dir)
    ctx = build_context(run_dir, figdir)  # reads stats/verdicts.json first: a run without one fails here
    figdir.mkdir(parents=True, exist_ok=True)  # also when no figure was drawn
    md_path, html_path = out / "report.md", out / "report.html"
    write_atomic(md_path, render_markdown(ctx))
    write_atomic(html_path, render_html(ctx))
    return {"md": md_path, "html": html_path, "figures": figdir}
