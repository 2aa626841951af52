"""mkdocs hook: result pages built from the reports themselves, so a number on the site is the report's number.

A page under docs/results/ that holds a line `<!-- report: NAME -->` gets, in its place, the body of
bench/results/NAME/report.md (its first heading dropped); the report's figures (bench/results/NAME/*.png) are published
beside the page as results/NAME/<figure>, and the report's image links point there.

Any page under docs/results/ or docs/benchmarks/ may also show a figure of bench/results/ by its path from the page,
`![what](../../bench/results/PATH.png)` (a link the forge follows too): the figure is published as results/PATH and the
link rewritten to it.
"""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")
MARKER = re.compile(r"^<!-- report: ([A-Za-z0-9_.-]+) -->$", re.M)
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)/]+\.png)\)")
FIGURE = re.compile(r"!\[([^\]]*)\]\(\.\./\.\./bench/results/([^)]+\.png)\)")
PAGES = ("results", "benchmarks")


def _reports(config) -> set[str]:
    names = set()
    folder = os.path.join(config["docs_dir"], "results")
    for page in os.listdir(folder) if os.path.isdir(folder) else []:
        if page.endswith(".md"):
            with open(os.path.join(folder, page), encoding="utf-8") as f:
                names.update(MARKER.findall(f.read()))
    return names


def _figures(config) -> set[str]:
    """The bench/results/ paths of the figures that pages show with FIGURE links."""
    paths = set()
    for folder in PAGES:
        folder = os.path.join(config["docs_dir"], folder)
        for page in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if page.endswith(".md"):
                with open(os.path.join(folder, page), encoding="utf-8") as f:
                    paths.update(m.group(2) for m in FIGURE.finditer(f.read()))
    return paths


def on_files(files, config):
    published = set()
    for name in sorted(_reports(config)):
        for fig in sorted(os.listdir(os.path.join(RESULTS, name))):
            if fig.endswith(".png"):
                published.add(f"{name}/{fig}")
    for path in sorted(published | _figures(config)):
        # src bench/results/PATH, site path results/PATH: linked as PATH from docs/results/
        files.append(File(f"results/{path}", os.path.dirname(RESULTS), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    def body(match: re.Match) -> str:
        name = match.group(1)
        with open(os.path.join(RESULTS, name, "report.md"), encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"\A# .*\n+", "", text)  # the page has its own title
        return IMAGE.sub(lambda m: f"![{m.group(1)}]({name}/{m.group(2)})", text)

    here = os.path.dirname(page.file.src_uri)
    markdown = FIGURE.sub(lambda m: f"![{m.group(1)}]({os.path.relpath('results/' + m.group(2), here)})", markdown)
    return MARKER.sub(body, markdown)
