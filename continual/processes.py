"""Worker processes of the library (env workers, IMPALA actors, background evaluation): how they are started, how a
failure is described, how they are stopped."""

from __future__ import annotations

import ast
import contextlib
import multiprocessing as mp
import multiprocessing.spawn
import sys
import time
from multiprocessing.context import BaseContext
from typing import Iterator, Optional, Sequence

# What the forkserver imports once, so that workers fork warm (a fork of the learner would copy torch's thread pools;
# spawn would re-import hackatari in every worker, ~3 s each). `set_forkserver_preload` is one setting for the whole
# process, read when the server starts: every kind of worker gets this one list (+ the Atari stack for Atari games).
PRELOAD = ["torch", "gymnasium", "continual.envs.vector", "continual.training.rewards"]
ATARI_PRELOAD = ["continual.envs.backends", "continual.envs.modifications", "hackatari.core", "ocatari.core",
                 "stable_baselines3.common.atari_wrappers"]


def mp_context(atari: bool = True, extra: Sequence[str] = ()) -> BaseContext:
    """The forkserver context every worker process of the library is started with (env workers, IMPALA actors,
    background evaluation). `extra`: modules of the caller to preload too (an agent file passes its own)."""
    mp.set_forkserver_preload(PRELOAD + (ATARI_PRELOAD if atari else []) + [m for m in extra if m not in PRELOAD])
    return mp.get_context("forkserver")


# --- a script without `if __name__ == "__main__":` --------------------------------------------------------------------
# A worker process started by spawn or forkserver runs the parent's main script again (as `__mp_main__`) before it
# unpickles its task, so that functions defined there can be found. A script that calls the Python API at its top
# level, unguarded, would call it again in every worker: multiprocessing refuses ("An attempt has been made to start a
# new process before the current process has finished its bootstrapping phase"). The API's calls find out whether they
# were made that way (`unguarded_main_call`) and then start their workers without that import
# (`workers_skip_main`): what the library sends a worker (env constructors by value, its own functions by module)
# needs nothing of the script.

MAIN_GUARD = 'if __name__ == "__main__":'


def _is_main_guard(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    if not isinstance(node, ast.If) or not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"] and isinstance(test.ops[0], ast.Eq)


def _guarded_lines(source: str) -> set[int]:
    """The lines of a module inside a top-level `if __name__ == "__main__":` block."""
    lines: set[int] = set()
    for node in ast.parse(source).body:
        if _is_main_guard(node):
            lines.update(range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def unguarded_main_call() -> Optional[str]:
    """'<script>:<line>' when this call comes from the top level of the main script (run as `python script.py` or
    `python -m module`), outside an `if __name__ == "__main__":` block; None otherwise (guarded, called from a
    function, a notebook, an interactive session, a child process)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or mp.parent_process() is not None:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            guarded = _guarded_lines(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # not a readable Python file: leave multiprocessing as it is
    return None if line in guarded else f"{path}:{line}"


@contextlib.contextmanager
def workers_skip_main(skip: bool = True) -> Iterator[None]:
    """Worker processes started inside the block do not run the main script again (`skip`; nothing changes
    otherwise). For the fork start method nothing is imported anyway."""
    if not skip:
        yield
        return
    original = multiprocessing.spawn.get_preparation_data

    def without_main(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    multiprocessing.spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        multiprocessing.spawn.get_preparation_data = original


def importing_main_in_worker() -> bool:
    """True in a worker process while it runs the parent's main script (`__mp_main__`): an API call made there is a
    script's unguarded top-level call reached again."""
    return bool(getattr(mp.current_process(), "_inheriting", False))


def stop_processes(processes: Sequence, join_timeout: float = 0.0, kill_timeout: float = 5.0) -> None:
    """Stop worker processes for good: wait up to `join_timeout` seconds (all together) for them to exit by
    themselves, then SIGTERM those still alive, then SIGKILL (waiting up to `kill_timeout` after each signal). No
    process outlives the call."""
    deadline = time.monotonic() + join_timeout
    for p in processes:
        if join_timeout > 0:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    for signal_them in ("terminate", "kill"):
        alive = [p for p in processes if p.is_alive()]
        for p in alive:
            getattr(p, signal_them)()
        deadline = time.monotonic() + kill_timeout
        for p in alive:
            p.join(timeout=max(0.1, deadline - time.monotonic()))


def dead_workers(processes) -> list[str]:
    """'env i (pid p) exited with code c' for every worker process that is no longer alive (a worker of several envs
    names them: its `label`, continual.envs.grouped)."""
    out = []
    for i, p in enumerate(processes or []):
        if not p.is_alive():
            out.append(f"{getattr(p, 'label', f'env {i}')} (pid {p.pid}) exited with code {p.exitcode}")
    return out


def describe_worker_failure(processes, error: Optional[BaseException]) -> str:
    dead = dead_workers(processes)
    if dead:
        return "environment worker died: " + "; ".join(dead)
    first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
    return f"environment worker failed: {first}"
