"""The README stays true: flag tables match the Args dataclass, and its extension examples run."""

import os
import re

from conftest import ROOT
from continual.config.args import readme_with_flags


def readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_flag_tables_match_args():
    text = readme()
    assert readme_with_flags(text) == text, "run: python -m continual.config.args --update-readme"


def test_first_screen_has_install_train_and_test_commands():
    first = "\n".join(readme().splitlines()[:20])
    assert "pip install -e ." in first and "python continual_training_example.py --config run_config.json" in first
    assert 'pip install -e ".[test]"' in first and "python -m pytest" in first


def test_factory_example_runs():
    code = re.search(r"```python\n(from modification_factories.*?)```", readme(), re.S).group(1)
    ns: dict = {}
    exec(code, ns)
    import modification_factories as mf

    f = mf.make_factory("EveryOtherFactory", {"num_total_steps": 40, "modifications": ["a", "b"]}, granularity=10)
    assert [f.get_modification(s) for s in (0, 10, 20, 35)] == ["a", "b", "a", "b"]


def test_layout_section_is_the_tree_as_it_is():
    """One line per module of agents/ and continual/, indented by folder, and nothing that does not exist."""
    block = re.search(r"## Layout\n.*?```\n(.*?)```", readme(), re.S).group(1)
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
    assert listed == actual, f"README layout: missing {sorted(actual - listed)}, not in the tree {sorted(listed - actual)}"
