import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BENCH = os.path.join(ROOT, "bench")

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
# One torch (OpenMP) thread per process, in the workers and in the runs they start (the pinned references run on one
# already): two workers, each running a training process or an IMPALA fleet, fill a small machine's cores, and
# torch's default for pixel runs, a thread per core, oversubscribes them (threads spin waiting for each other).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture
def ray_shutdown():
    """Shut down the Ray instance a test's in-process launcher started (tests/test_launch*.py)."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def run_script(*argv: str, timeout: float = 600, check: bool = True, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """Run a repository script as a user would (CleanRL-style subprocess smoke test)."""
    from helpers.trainer_faults import faulty  # a plan's trainer faults: monkeypatches in the child

    full_env = {**os.environ, "WANDB_MODE": "offline", **(env or {})}
    proc = subprocess.run([sys.executable, *faulty(list(argv), env)], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}")
    return proc


# warnings a fresh interpreter does not print (Python's default filters); run_main writes any other as a line
SILENT_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_main(script: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """`script`'s `main(argv)` (a repository script, e.g. "eval.py", "agents/ppo.py") in this process, from the
    repository root, for tests of what a run does rather than of its process: it spares a second import of torch
    (about 5 s of CPU a run). Returns what run_script returns, with what the process would have printed: stdout,
    stderr, a line per warning, a traceback and exit code 1 for an uncaught exception. Torch's thread count and the
    SIGINT/SIGTERM handlers are given back as they were. Kills, signals, faults and anything a process shows (output at
    import time, the exit status a shell sees) need run_script."""
    import contextlib
    import io
    import signal
    import traceback
    import warnings

    import torch

    module = importlib.import_module(os.path.splitext(script)[0].replace("/", "."))
    out, err = io.StringIO(), io.StringIO()
    cwd, sys_argv, threads = os.getcwd(), sys.argv, torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def show(message, category, filename, lineno, file=None, line=None):  # in order, among the other lines
        if not issubclass(category, SILENT_WARNINGS):
            err.write(warnings.formatwarning(message, category, filename, lineno, line))

    code = 0
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("default")  # once per place, as in a fresh process
        warnings.showwarning = show
        os.chdir(ROOT)
        sys.argv = [script, *argv]
        try:
            module.main(list(argv))
        except SystemExit as e:  # as the interpreter reports it
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            os.chdir(cwd)
            sys.argv = sys_argv
            torch.set_num_threads(threads)
            for s, handler in handlers.items():
                signal.signal(s, handler)
    proc = subprocess.CompletedProcess([script, *argv], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{script} {list(argv)} exited {code} (in-process)\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}")
    return proc


def exit_2(main, argv: list[str], capsys) -> tuple[str, str]:
    """A script's `main(argv)` on bad input, in-process (no second torch import): it exits with code 2; returns
    (stdout, stderr) for the caller to check its one line. tests/test_bad_input.py runs whole scripts (run_main, a few
    as subprocesses)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2, err
    return out, err


def write_config(folder, data, name: str = "run_config.json") -> str:
    """A config file `folder`/`name` holding `data` (a dict as JSON, a str as it is); its path."""
    path = Path(folder) / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def load_bench(script: str):
    """bench/<script>.py as a module, loaded with bench/ first on sys.path (as when run as a script: it imports
    bench/common.py as `common`)."""
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{script}", os.path.join(BENCH, f"{script}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(BENCH)


@pytest.fixture
def root() -> str:
    return ROOT


def assert_resume_matches(full: str, cut: str, final: str, after_step: int) -> None:
    """A run resumed in `cut` ends with the uninterrupted run's (`full`) weights in checkpoints/`final`, and plays
    the same games (step, return) after `after_step` (more than 10 of them)."""
    import torch

    from continual.training.tracking import read_metrics

    a, b = (torch.load(os.path.join(d, "checkpoints", final), weights_only=True) for d in (full, cut))
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    ep = [[(r["global_step"], r["return"]) for r in read_metrics(os.path.join(d, "metrics.jsonl"))
           if r["kind"] == "episode" and r["global_step"] > after_step] for d in (full, cut)]
    assert ep[0] == ep[1] and len(ep[0]) > 10


# a seed-style factory: a plain class with get_modification(step) (tests/test_curricula_*.py)
SEED_STYLE_MODULE = '''
import random

import numpy as np


class SeedStyleFactory:
    """As the seed document describes it: num_total_steps + kwargs, get_modification(step) -> str.
    Stateful on purpose: it counts its calls and re-draws from the *global* np.random / random every 2nd call."""

    def __init__(self, num_total_steps, modifications, hold=2):
        self.num_total_steps = num_total_steps
        self.modifications = modifications
        self.hold = hold
        self.calls = 0
        self.current = modifications[0]
        self.offset = random.randrange(1000)  # constructors may draw too

    def get_modification(self, step):
        if self.calls % self.hold == self.hold - 1:
            self.current = self.modifications[int(np.random.randint(len(self.modifications)))]
        self.calls += 1
        return self.current
'''


@pytest.fixture
def seed_style_file(tmp_path: Path) -> Path:
    file = tmp_path / "my_seed_factories.py"
    file.write_text(SEED_STYLE_MODULE)
    return file


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which may already have applied the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Tests that share a module-scoped fixture of their module (one training run, the bad-input cases) run on one
    xdist worker: each worker that ran one of them would run the fixture again. Then the `xdist_group`s (these, Ray's)
    are applied as xdist does under `--dist loadgroup`, on the structured node id where xdist 3.8 only sets the old
    string one: with pytest 9.2 its groups are ignored otherwise (pytest-dev/pytest-xdist#1386). First of all, the
    tests marked `long` go to the front: xdist hands the single tests out in collection order after the groups, and
    one of a minute near the end (the default run's kill test was 25th from last) leaves the other worker idle."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: the rest keep their order
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if item.get_closest_marker("xdist_group") is None and info is not None and any(
                defs[-1].scope == "module" and getattr(defs[-1].func, "__module__", None) == item.module.__name__
                for defs in info.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if not (hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False)):
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if not groups or item.nodeid.endswith(suffix):
            continue
        node_id = getattr(item, "_id", None)
        if node_id is None or isinstance(node_id, str):
            item._nodeid = item.nodeid + suffix  # pytest < 9.2, as xdist does
        else:
            item._id = type(node_id).parse(item.nodeid + suffix)
