"""mkdocs hook: result pages built from the reports themselves, so a number on the site is the report's number.

A page under docs/results/ that holds a line `<!-- report: NAME -->` gets, in its place, the body of
bench/results/NAME/report.md (its first heading dropped); the report's figures (bench/results/NAME/*.png) are published
beside the page as results/NAME/<figure>, and the report's image links point there.
"""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")
MARKER = re.compile(r"^<!-- report: ([A-Za-z0-9_.-]+) -->$", re.M)
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)/]+\.png)\)")


def _reports(config) -> set[str]:
    names = set()
    folder = os.path.join(config["docs_dir"], "results")
    for page in os.listdir(folder) if os.path.isdir(folder) else []:
        if page.endswith(".md"):
            with open(os.path.join(folder, page), encoding="utf-8") as f:
                names.update(MARKER.findall(f.read()))
    return names


def on_files(files, config):
    for name in sorted(_reports(config)):
        for fig in sorted(os.listdir(os.path.join(RESULTS, name))):
            if fig.endswith(".png"):
                # src bench/results/NAME/fig, site path results/NAME/fig: linked as NAME/fig from docs/results/
                files.append(File(f"results/{name}/{fig}", os.path.dirname(RESULTS), config["site_dir"],
                                  config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    def body(match: re.Match) -> str:
        name = match.group(1)
        with open(os.path.join(RESULTS, name, "report.md"), encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"\A# .*\n+", "", text)  # the page has its own title
        return IMAGE.sub(lambda m: f"![{m.group(1)}]({name}/{m.group(2)})", text)

    return MARKER.sub(body, markdown)
