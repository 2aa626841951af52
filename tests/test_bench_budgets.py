"""bench/ stays a small set of benchmarks and the tracked experiment data stays within its stated budget.

bench/ holds only the speed and cost scripts that a page under docs/benchmarks/ cites, each sharing bench/common.py,
in at most BENCH_LINES lines of Python; experiment drivers belong to configs/experiments/ and reports to
continual/report/. Each folder under bench/experiments/ is at most EXPERIMENT_BYTES, unless it has a budget of its own;
docs/experiments.md states the same budget."""

from __future__ import annotations

import os
import re

from conftest import ROOT

BENCH = os.path.join(ROOT, "bench")
BENCH_LINES = 2_500
EXPERIMENT_BYTES = 20_000_000
EXCEPTIONS = {
    # v1's 85 runs, frozen: their metrics keep only the records the forgetting report reads (2.1 MB; python -m
    # continual.launch.archive --compact ... --records forgetting, the raw files' sha256 in its manifest)
    "forgetting_minatar": 3_000_000,
    # v2's 163 runs, archived as they land: the first 35 average 0.19 MB (about 31 MB when complete)
    "forgetting_minatar_v2": 50_000_000,
    # while its 6M-step DQN seeds run (15-30 h each, sessions of 3 h): the carry of the 10 in flight (continual/launch/
    # carry.py, 2.3-4 MB a seed) beside its archived runs
    "c_chain_minatar": 60_000_000,
}


def scripts() -> list[str]:
    return sorted(f for f in os.listdir(BENCH) if f.endswith(".py"))


def python_files() -> list[str]:
    """Every .py under bench/ but the experiments' and results' data, as paths relative to bench/."""
    return sorted(os.path.relpath(os.path.join(d, f), BENCH) for d, dirs, files in os.walk(BENCH)
                  if os.path.relpath(d, BENCH).split(os.sep)[0] not in ("experiments", "results")
                  for f in files if f.endswith(".py"))


def test_bench_is_within_its_line_budget():
    """The whole of bench/, its subfolders included (a tool kept in one, bench/device/, once hid 93 lines)."""
    assert python_files() == scripts(), "bench/ keeps its benchmarks at its top level"
    lines = {f: sum(1 for _ in open(os.path.join(BENCH, f), encoding="utf-8")) for f in python_files()}
    assert sum(lines.values()) <= BENCH_LINES, f"bench/ has {sum(lines.values())} lines of Python (budget " \
        f"{BENCH_LINES}): {lines}"


def test_every_benchmark_shares_common_and_a_page_cites_it():
    pages = ""
    for page in os.listdir(os.path.join(ROOT, "docs", "benchmarks")):
        with open(os.path.join(ROOT, "docs", "benchmarks", page), encoding="utf-8") as f:
            pages += f.read()
    for name in scripts():
        if name == "common.py":
            continue
        with open(os.path.join(BENCH, name), encoding="utf-8") as f:
            assert re.search(r"^import common\b", f.read(), re.M), f"bench/{name} does not use bench/common.py"
        assert f"python bench/{name}" in pages, f"bench/{name}: no page under docs/benchmarks/ gives its command"
    assert not os.path.exists(os.path.join(BENCH, "__init__.py"))  # scripts, not a package that code imports


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_experiment_folders_are_within_their_budget():
    root = os.path.join(BENCH, "experiments")
    for name in sorted(os.listdir(root)):
        size, budget = folder_bytes(os.path.join(root, name)), EXCEPTIONS.get(name, EXPERIMENT_BYTES)
        assert size <= budget, f"bench/experiments/{name}: {size / 1e6:.1f} MB, over its budget of {budget / 1e6:.0f} " \
            "MB (keep only the records its report reads; the rest stays outside git)"


def test_the_budget_is_stated_where_users_read_it():
    with open(os.path.join(ROOT, "docs", "experiments.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert f"{EXPERIMENT_BYTES // 1_000_000} MB per experiment" in text
    for name, budget in EXCEPTIONS.items():
        assert f"`{name}` {budget // 1_000_000} MB" in text, name
