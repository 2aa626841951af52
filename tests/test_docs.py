"""The docs stay true: README's first screen has the two commands, the flag reference matches the Args dataclass,
the extension example runs, the layout matches the tree, and no page links to a file or anchor that is not there."""

import os
import re

import pytest

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
    """README and bench/RESULTS.md (the index of the result and benchmark pages) are read on the forge, not built by
    mkdocs --strict: their relative links are checked here (files, and the headings that anchors name)."""
    for name in ("README.md", os.path.join("bench", "RESULTS.md")):
        here = os.path.dirname(os.path.join(ROOT, name))
        links = re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", read(name))
        assert links, name
        for path, anchor in links:
            target = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, name)
            assert os.path.exists(target), f"{name}: {path}"
            if anchor:
                assert anchor in headings(target), f"{name}: {path}#{anchor}"


def test_every_result_and_benchmark_page_is_in_the_index_readme_links():
    """Issue 50: results are pages, one per experiment and per benchmark, reached from README through the index."""
    assert "](bench/RESULTS.md)" in read("README.md")
    index = read("bench", "RESULTS.md")
    for folder in ("results", "benchmarks"):
        for page in sorted(os.listdir(os.path.join(ROOT, "docs", folder))):
            assert f"](../docs/{folder}/{page})" in index, f"bench/RESULTS.md does not link docs/{folder}/{page}"


RESULT_PAGES = [os.path.join("docs", folder, page) for folder in ("results", "benchmarks")
                for page in sorted(os.listdir(os.path.join(ROOT, "docs", folder))) if page.endswith(".md")]
# a command that reproduces a page today, or a script since deleted named by revision (`da56a98:bench/NAME.py`)
COMMAND = re.compile(r"python -m continual\.(launch|report) |python bench/\w+\.py|python continual_training_example\.py "
                     r"|python -m pytest |\b[0-9a-f]{7,40}:bench/\w+\.py")


def test_every_result_and_benchmark_page_says_what_how_and_beside_what_above_its_numbers():
    """Issue 50: every page of results/ and benchmarks/ opens, above its first section (or the report it shows), with
    what it measures, how to reproduce it (a command that exists today, or a deleted script named by revision) and the
    published numbers beside ours (or that there are none), and shows a table or a figure."""
    assert len(RESULT_PAGES) >= 17, RESULT_PAGES
    for page in RESULT_PAGES:
        text = read(page)
        head = re.split(r"^## |^<!-- report: ", text, maxsplit=1, flags=re.M)[0]
        assert "**Question.**" in head, f"{page}: no **Question.** above its first section"
        assert "**Reproduce.**" in head, f"{page}: no **Reproduce.** above its first section"
        reproduce = head.split("**Reproduce.**")[1].split("\n\n**")[0]
        assert COMMAND.search(reproduce), f"{page}: **Reproduce.** names no command"
        assert re.search(r"\*\*(Published numbers|The numbers) beside ours\.\*\*", head), \
            f"{page}: no **Published numbers beside ours.** above its first section"
        assert re.search(r"^\|[-| :]+\|$", text, re.M) or "![" in text or "<!-- report: " in text, \
            f"{page}: shows no table or figure"


def test_an_experiment_page_reproduces_its_report_with_continual_report():
    """A page that shows an experiment's report (`<!-- report: NAME -->`, its tables and figures inlined by
    docs/_hooks/results.py) says above it how to reproduce it with `python -m continual.report`."""
    pages = sorted(p for p in os.listdir(os.path.join(ROOT, "docs", "results"))
                   if "<!-- report: " in read("docs", "results", p))
    assert {"forgetting.md", "plasticity.md", "minatar.md"} <= set(pages), pages
    for page in pages:
        head = read("docs", "results", page).split("<!-- report: ")[0]
        assert "python -m continual.report " in head, page  # from the archived runs, or the runs' records
        name = re.search(r"<!-- report: ([\w.-]+) -->", read("docs", "results", page)).group(1)
        assert os.path.exists(os.path.join(ROOT, "bench", "results", name, "report.md")), (page, name)


def expand(pattern: str) -> list[str]:
    """A shell-style `{a,b}` in a cited path, expanded (nested and repeated ones too)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [p for part in m.group(1).split(",") for p in expand(pattern[:m.start()] + part + pattern[m.end():])]


def cited_results() -> tuple[set[str], set[str]]:
    """The file patterns (paths relative to bench/results, `*` allowed) and the report folders that the pages
    (README, docs/, bench/RESULTS.md) and the tests cite."""
    texts = [read("README.md"), read("bench", "RESULTS.md")]
    texts += [read(os.path.relpath(os.path.join(d, f), ROOT)) for top in ("docs", "tests")
              for d, _, files in os.walk(os.path.join(ROOT, top)) for f in files if f.endswith((".md", ".py"))]
    patterns, folders = set(), set()
    for text in texts:
        folders.update(re.findall(r"<!-- report: ([\w.-]+) -->", text))
        for token in re.findall(r"[\w.*{},/-]+", text):
            path = token.split("bench/results/")[-1].strip(".,")
            for path in expand(path):
                if "bench/results/" in token and re.fullmatch(r"[\w.-]+/?", path) and "." not in path:
                    folders.add(path.strip("/"))  # bench/results/NAME/ or --out bench/results/NAME: a report folder
                elif "." in os.path.basename(path) and not path.startswith("*"):
                    patterns.add(path)
    return patterns, folders


def test_every_file_in_bench_results_is_cited_by_a_page_or_a_test():
    """Issue 50: bench/results/ holds only what a page shows or quotes numbers from (or a test reads): a file is cited
    by its path under bench/results/ (a `{a,b}` or `*` pattern cites each file it matches), or lies in a report folder
    a page cites (`bench/results/NAME/`, `<!-- report: NAME -->`). Cite a new raw file on its page, or leave it out."""
    import fnmatch

    patterns, folders = cited_results()
    results = os.path.join(ROOT, "bench", "results")
    orphans = []
    for d, _, files in os.walk(results):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), results).replace(os.sep, "/")
            if f.startswith(".") or rel.split("/")[0] in folders or rel in patterns:
                continue
            if not any(fnmatch.fnmatchcase(rel, p) for p in patterns if "*" in p):
                orphans.append(rel)
    assert not orphans, f"bench/results/ files no page or test cites: {sorted(orphans)}"


def test_no_page_runs_a_file_outside_the_package_but_a_benchmark():
    """Experiments run through `python -m continual.launch` and `python -m continual.report`; the only scripts outside
    the package that a page (README, docs/) tells a user to run are the benchmarks in bench/. A script since deleted is
    named by revision (`da56a98:bench/NAME.py`), never as a command."""
    pages = ["README.md"] + [os.path.relpath(os.path.join(d, f), ROOT) for d, _, files in os.walk(os.path.join(ROOT, "docs"))
                             for f in files if f.endswith(".md")]
    bench = set(os.listdir(os.path.join(ROOT, "bench")))
    for page in pages:
        for name in re.findall(r"python3? bench/(\w+\.py)", read(page)):
            assert name in bench and name != "common.py" or name == "NAME.py", f"{page}: `python bench/{name}` is not a benchmark in bench/"
        assert "bench/RESULTS.md#" not in read(page), f"{page}: RESULTS.md is an index now; link the page"
        run = re.search(r"python3? \S*[0-9a-f]{7,40}:bench/\w+\.py", read(page))
        assert not run, f"{page}: `{run and run.group(0)}` tells a user to run a deleted script; name it as REV:bench/NAME.py"


# issue 50: `python -m continual.report` reproduces the committed reports, or a page states why one is kept as written
REPRODUCED = {  # bench/results/<name> -> the test that rebuilds it (byte for byte, or with the diff it states)
    "forgetting_minatar_v1_reanalysis": ("test_report_forgetting.py",
                                         "test_committed_v1_reanalysis_is_reproduced_with_its_stated_diff"),
    "forgetting_minatar_v2": ("test_report_forgetting.py", "test_committed_v2_report_is_reproduced_byte_for_byte"),
    "forgetting_minatar_v2_tuning": ("test_report_tuning.py",
                                     "test_committed_v2_tuning_report_is_reproduced_and_its_choice_is_what_v2_runs"),
    "hackatari_freeway_pilot": ("test_report_budget.py",
                                "test_committed_freeway_pilot_report_is_reproduced_byte_for_byte"),
    "hackatari_freeway_robustness": ("test_report_robustness.py",
                                     "test_committed_freeway_robustness_report_is_reproduced_byte_for_byte"),
    "minatar_reference": ("test_report_minatar.py", "test_rebuilt_from_the_committed_report_json_reproduces_it"),
    "minatar_ppo_1m": ("test_report_minatar.py", "test_rebuilt_from_the_committed_report_json_reproduces_it"),
    "plasticity_minatar": ("test_report_plasticity.py", "test_from_report_reproduces_the_committed_report"),
}
KEPT = {  # made by a retired script or an earlier form of the report (their runs are gone): the page that says so
    "forgetting_minatar": "docs/results/forgetting.md",
    "minihack_nav_small": "docs/results/minihack.md",
    "plasticity_minatar_pilot": "docs/results/plasticity.md",
    "plasticity_minatar_pilot250k": "docs/results/plasticity.md",
}


def test_every_committed_report_is_reproduced_or_a_page_says_it_is_kept():
    results = os.path.join(ROOT, "bench", "results")
    committed = {d for d in os.listdir(results) if os.path.exists(os.path.join(results, d, "report.md"))}
    assert committed == set(REPRODUCED) | set(KEPT) and not set(REPRODUCED) & set(KEPT), committed
    for name, (module, test) in REPRODUCED.items():
        text = read("tests", module)
        assert f"def {test}(" in text and name in text, (name, module, test)
    for name, page in KEPT.items():
        text = flat(read(page))
        said = [text[m.start():m.start() + 400] for m in re.finditer(re.escape(f"bench/results/{name}/"), text)]
        assert any("kept as written" in s or "not regenerated" in s for s in said), (name, page)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_documented_numbers_have_one_source():
    """Numbers the README and the docs both state agree with each other and with the file they come from: the test
    suite's time, the forgetting and plasticity experiments' run counts (their experiment files), the README's
    forgetting intervals and figure (the current report), and the evaluation page's account of run_config.json."""
    import json

    readme, experiments = flat(read("README.md")), flat(read("docs", "experiments.md"))
    started, evaluation = flat(read("docs", "getting-started.md")), flat(read("docs", "evaluation.md"))
    # the test suite's time
    assert re.search(r"~([\d-]+) min on a 2-core CPU, by CPU model: CI took (\d+) min", readme).groups() == \
        re.search(r"~([\d-]+) min on a 2-core CPU, by CPU model \(CI: (\d+) min", started).groups()
    # the forgetting experiment: methods, configurations, references and runs, as its file expands
    grid = json.load(open(os.path.join(ROOT, "configs", "experiments", "forgetting_minatar.json")))["grid"]
    names, seeds = [f["name"] for f in grid["flags"]], len(grid["seed"])
    configurations = [n for n in names if not n.startswith("reference_")]
    references, runs = (len(names) - len(configurations)) * seeds, len(names) * seeds
    for text in (readme, experiments):
        assert f"8 methods ({len(configurations)} configurations with the EWC lambda sweeps and PPO_CBP's CNN " \
               f"control) x" in text
        assert f"+ {references} single-task references = {runs}" in text
    assert f"experiment's {runs} runs" in experiments
    # the methods the committed report has (arms appended to the file for its next run are not in it yet)
    grid = json.load(open(os.path.join(ROOT, "configs", "experiments", "plasticity_minatar.json")))["grid"]
    report = json.load(open(os.path.join(ROOT, "bench", "results", "plasticity_minatar", "report.json")))
    methods, seeds = len(report["table"]), len(grid["seed"])
    assert f"{methods} methods x {seeds} seeds" in readme
    assert f"{methods} methods x seeds 1-{seeds} = {methods * seeds}" in experiments
    # the README's forgetting result: its intervals are the current report's, its figure is from that report
    part = readme.split("**Forgetting, and CORA's CLEAR result**")[1].split("**Loss of plasticity**")[0]
    report_path = re.search(r"\]\((bench/results/[^)]*/report\.md)\)", part).group(1)
    report = read(report_path).replace("+", "")
    intervals = re.findall(r"[+-]?\d+\.\d+ \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]", part)
    assert len(intervals) >= 2
    for interval in intervals:
        assert interval.replace("+", "") in report, interval
    figures = re.findall(r"!\[[^\]]*forgetting[^\]]*\]\(([^)]+)\)", read("README.md"))
    assert figures and all(os.path.dirname(f) == os.path.dirname(report_path) for f in figures), figures
    # the evaluation page and run_config.json (the default run)
    from continual.config.loading import parse_args
    from continual.training.startup import build_factory

    config = json.load(open(os.path.join(ROOT, "run_config.json")))
    args, curriculum = parse_args(["--config", os.path.join(ROOT, "run_config.json")])
    regimes = len(build_factory(args, curriculum, args.rollout_size()).possible_modifications())
    assert f"{config['max_episode_steps']} in `run_config.json`" in evaluation
    assert f"caps training games at {config['max_episode_steps']} agent steps" in evaluation
    assert f"one round of {regimes} regimes" in evaluation and f"({regimes} for `run_config.json`" in evaluation
    assert f"evaluates {config['eval_episodes']} game per regime capped at {config['eval_max_episode_steps']} steps " \
           f"every {config['eval_every']:,} steps" in evaluation


@pytest.mark.slow  # ~10 s of CPU to read 20 runs; the archive's manifest already pins what it reads
def test_readme_and_results_page_state_v2s_primary_pair_as_its_archive_gives_it():
    """The v2 forgetting numbers README and docs/results/forgetting.md state (the declared primary pair, complete
    while the other arms run) are what the declared metric computes from the committed archive: the per-method CORA
    scale and the pair's own runs make them independent of the runs still to come."""
    from continual.evaluation import cora, statistics
    from continual.evaluation.metrics import load_run
    from continual.report import forgetting

    folder = os.path.join(ROOT, "bench", "experiments", "forgetting_minatar_v2")
    decl = forgetting.declarations(folder)
    primary, pair = decl["primary_metric"], decl["primary_pair"]
    values = {}
    for method in pair:
        dirs = sorted(d for d in os.listdir(os.path.join(folder, "runs")) if d.split("_seed=")[0].endswith(f"_{method}")
                      and forgetting.finished(folder, d))
        runs = [load_run(os.path.join(folder, "runs", d)) for d in dirs]
        assert [forgetting.label(r) for r in runs] == [method] * 10
        f = cora.cora_forgetting(runs, rolling_mean_count=primary["rolling_mean_count"],
                                 num_cycles_for_forgetting=primary["num_cycles_for_forgetting"])
        key = next(t for t in f["tasks"] if t.endswith(primary["task"]))
        values[method] = f["by_task"][key]["per_run"]
    x, y = pair
    difference = statistics.compare(values[x], values[y], lower_is_better=True).as_dict()["mean_difference"]
    stated = [f"{m} " + forgetting._fmt(statistics.interval(values[m]).as_dict()).split(" (n=")[0] for m in pair]
    stated.append(f"{x} - {y} " + forgetting._fmt(difference).split(" (n=")[0])
    readme = flat(read("README.md")).split("**Forgetting v2:")[1].split("**Forgetting, and")[0]
    page = flat(read("docs", "results", "forgetting.md")).split("**v2**")[1].split("**v1**")[0]
    for text in (readme, page):
        for s in stated:
            assert s in text, s
