"""The report with hostile names: a task, group or model name, a prompt or a token that holds HTML, markdown
syntax or backtick fences is shown as written in report.md and report.html, never rendered."""

from __future__ import annotations

import json
import re
from html import escape as html_escape
from html.parser import HTMLParser

import pytest
from synthetic import make_run, reseal

from evalparity.report import md_escape, md_fence, write_report
from evalparity.samples import read_table, write_table
from evalparity.stats.compare import StatsOptions, compute

XSS = "<img src=x onerror=alert(1)>"
GROUP = f"{XSS}`tick`|pipe|[link](x)"
PROMPT_TAIL = " ```\n<script>alert(2)</script> | [x](y) ````` end"  # a 5-backtick run: the fence needs 6


def fenced_blocks(md: str) -> list[str]:
    """The contents of the fenced code blocks of ``md``, as CommonMark reads them: a line of three or more
    backticks opens a block, which only a line of at least as many backticks (and nothing else) closes."""
    blocks, lines, i = [], md.split("\n"), 0
    while i < len(lines):
        opener = re.fullmatch(r"`{3,}", lines[i])
        i += 1
        if opener:
            body = []
            while i < len(lines) and not re.fullmatch(rf"`{{{len(opener.group())},}}\s*", lines[i]):
                body.append(lines[i])
                i += 1
            assert i < len(lines), "a fence is never closed"
            blocks.append("\n".join(body))
            i += 1
    return blocks


def outside_fences(md: str) -> str:
    for block in fenced_blocks(md):
        md = md.replace(block, "")
    return md


class Page(HTMLParser):
    """report.html as a browser parses it: its tags, and the text of each element kind."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.open: list[str] = []
        self.text: dict[str, list[str]] = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("meta", "img"):
            self.open.append(tag)
            self.text.setdefault(tag, []).append("")

    def handle_endtag(self, tag):
        assert self.open.pop() == tag, tag

    def handle_data(self, data):
        if self.open:
            self.text[self.open[-1]][-1] += data


def _drift_summary() -> dict:
    """A minimal ``drift/<cell>.json`` whose worst tokens hold a fence and HTML."""
    layers = [{"layer": i, "rel_error": 1e-6 * (i + 1), "cosine": 1 - 1e-9} for i in range(3)]
    return {"cell": "vllm-fp32", "n_prompts": 2, "reference": "hf-fp32", "threshold": 1e-3,
            "first_layer_over_threshold": None,
            "layers": layers, "by_position": [{"bucket": 0, "rel_error": 1e-6}],
            "prompt_logprobs": {"abs_mean": 1e-6, "abs_p99": 2e-6, "abs_max": 3e-6}, "generations": None,
            "tokenization_mismatches": [],
            "worst_tokens": [{"abs_delta": 1e-5, "prompt": 0, "position": 3, "context": "see ```` here",
                              "token": XSS}]}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("hostile") / "run", n_tasks=2, cells=["hf-fp32", "vllm-fp32"],
                    docs_per_task=60, group=GROUP, drift={"vllm-fp32": 0.3}, model=f"org/{XSS}[model](x)")
    for cell in ("hf-fp32", "vllm-fp32"):
        table = read_table(root / "cells" / cell / "samples.parquet")
        table["context"] = table["context"] + PROMPT_TAIL
        write_table(table, root / "cells" / cell / "samples.parquet")
    reseal(root)
    (root / "drift").mkdir()
    (root / "drift" / "vllm-fp32.json").write_text(json.dumps(_drift_summary()))
    compute(root, StatsOptions())
    paths = write_report(root)
    return paths["md"].read_text(), paths["html"].read_text()


def test_md_escape_and_fence_as_documented():
    assert md_escape(XSS) == "&lt;img src=x onerror=alert(1)&gt;"
    assert md_escape("a|b `c` [l](x) *s* _u_ #h !i \\ &\nnext") == (
        r"a\|b \`c\` \[l\](x) \*s\* \_u\_ \#h \!i \\ &amp; next")
    assert md_fence("plain") == "```\nplain\n```\n"
    text = "```\ncode\n```\nand ````` five"
    assert md_fence(text).startswith("``````\n")
    assert fenced_blocks(md_fence(text)) == [text]


def test_hostile_names_are_escaped_in_markdown(hostile):
    md, _ = hostile
    prose = outside_fences(md)
    assert XSS not in prose and "<script>" not in prose  # both only inside fences, as written
    assert md_escape(GROUP) in prose  # the group's verdict row
    assert md_escape(f"org/{XSS}[model](x)") in prose.splitlines()[1]  # the title
    # The fold's summary line is an HTML block, where markdown is not read: HTML-escaped only.
    assert "<details><summary>&lt;img src=x onerror=alert(1)&gt;`tick`|pipe|[link](x): 2 member tasks" in prose
    markdown_lines = [line for line in prose.splitlines() if not line.startswith("<details><summary>")]
    assert not [line for line in markdown_lines if "[link](x)" in line or "[model](x)" in line]
    # A pipe in a name does not split a table cell: every row of a table has its header's columns.
    for table in re.findall(r"(?m)(?:^\|.*\n)+", prose):
        counts = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(counts) == 1, table


def test_prompts_with_fences_stay_inside_their_fence(hostile):
    md, _ = hostile
    blocks = fenced_blocks(md)
    samples = [b for b in blocks if "prompt: " in b]
    assert samples and all("````` end" in b and "<script>alert(2)</script>" in b for b in samples)
    assert "``````\n" in md  # longer than the prompt's run of five
    worst = [b for b in blocks if "|Δ|" in b and "prompt 0 pos 3" in b]
    assert len(worst) == 1 and XSS in worst[0] and "````" in worst[0]
    assert "alert(2)" not in outside_fences(md)  # nothing of the prompt leaks out of its fence


def test_hostile_names_are_escaped_in_html(hostile):
    _, html = hostile
    assert XSS not in html and "<script>alert(2)" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    page = Page(html)
    # the only images are the figures, the only script the self-check
    assert all(attrs["src"].startswith("data:image/png;base64,") for tag, attrs in page.tags if tag == "img")
    assert [tag for tag, _ in page.tags].count("script") == 1
    assert not any(k.startswith("on") for _, attrs in page.tags for k in attrs)
    # shown as written: the names in the text, the prompt inside a <pre>
    assert f"org/{XSS}[model](x)" in page.text["h1"][0]
    assert any(cell.startswith(GROUP) for cell in page.text["td"])
    assert any(PROMPT_TAIL.replace("\n", "\\n") in pre for pre in page.text["pre"])


def test_markdown_and_html_say_the_same(hostile):
    """What the two templates print side by side: each heading, paragraph, table cell (and the parts of a
    matrix cell), legend entry and reason of report.html is in report.md, markdown-escaped (prose wrapped in a
    template reads the same in both)."""
    md, html = hostile
    page = Page(html)
    flat = " ".join(md.split())
    for tag in ("h1", "h2", "h3", "p", "th", "td", "span", "li", "summary", "figcaption"):  # not the HTML-only caption
        for text in page.text.get(tag, []):
            # a fold's summary line is an HTML block in report.md too: HTML-escaped there, not markdown-escaped,
            # and without the page's note on which verdict gates (the pooled row above says it)
            fold = text.removesuffix(" (the group's pooled verdict above gates)")
            shown = html_escape(fold, quote=False) if fold != text else md_escape(text)
            assert " ".join(shown.split()) in flat, (tag, text)
    for text in page.text["pre"]:
        assert text in fenced_blocks(md)
