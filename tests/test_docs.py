"""The docs stay true: README's first screen has the two commands, the flag reference matches the Args dataclass,
the extension example runs, the layout matches the tree, and no page links to a file or anchor that is not there."""

import os
import re

from conftest import ROOT
from continual.config.args import FLAGS_DOC, with_flag_tables


def read(*path: str) -> str:
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_flag_tables_match_args():
    text = read(FLAGS_DOC)
    assert with_flag_tables(text) == text, "run: python -m continual.config.args --update-docs"


def test_first_screen_has_install_train_and_test_commands():
    first = "\n".join(read("README.md").splitlines()[:20])
    assert "pip install -e ." in first and "python continual_training_example.py --config run_config.json" in first
    assert 'pip install -e ".[test]"' in first and "python -m pytest" in first


def test_readme_is_a_front_page():
    assert os.path.getsize(os.path.join(ROOT, "README.md")) <= 15_000


def test_factory_example_runs():
    code = re.search(r"```python\n(from modification_factories.*?)```", read("docs", "extending.md"), re.S).group(1)
    ns: dict = {}
    exec(code, ns)
    import modification_factories as mf

    f = mf.make_factory("EveryOtherFactory", {"num_total_steps": 40, "modifications": ["a", "b"]}, granularity=10)
    assert [f.get_modification(s) for s in (0, 10, 20, 35)] == ["a", "b", "a", "b"]


def test_layout_section_is_the_tree_as_it_is():
    """One line per module of agents/ and continual/, indented by folder, and nothing that does not exist."""
    block = re.search(r"## Layout\n.*?```\n(.*?)```", read("docs", "development.md"), re.S).group(1)
    listed, folders = set(), []
    for line in block.splitlines():
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip())) // 2
        folders = folders[:depth]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif name.endswith(".py"):
            listed.add("/".join([*folders, name]))
    actual = {os.path.relpath(os.path.join(d, f), ROOT) for top in ("agents", "continual")
              for d, _, files in os.walk(os.path.join(ROOT, top)) if "__pycache__" not in d
              for f in files if f.endswith(".py") and not (f == "__init__.py" and os.path.getsize(os.path.join(d, f)) == 0)}
    actual |= {f for f in os.listdir(ROOT) if f.endswith(".py")}
    assert listed == actual, f"docs layout: missing {sorted(actual - listed)}, not in the tree {sorted(listed - actual)}"


def headings(path: str) -> set[str]:
    """The anchors a forge makes of a file's headings: lower case, punctuation dropped, spaces as hyphens."""
    with open(path) as f:
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", f.read(), re.M)}


def test_readme_and_results_links_point_at_files_and_headings_that_exist():
    """README and bench/RESULTS.md are read on the forge, not built by mkdocs --strict: their relative links are
    checked here (files, and the headings that anchors name)."""
    for name in ("README.md", os.path.join("bench", "RESULTS.md")):
        here = os.path.dirname(os.path.join(ROOT, name))
        links = re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", read(name))
        assert links, name
        for path, anchor in links:
            target = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, name)
            assert os.path.exists(target), f"{name}: {path}"
            if anchor:
                assert anchor in headings(target), f"{name}: {path}#{anchor}"
