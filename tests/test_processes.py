"""continual.processes: stop_processes (the one join -> SIGTERM -> SIGKILL of IMPALA actors, the background
evaluation and env workers) and mp_context (the one forkserver preload list)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time

from continual import processes


def _exits_when_told(conn) -> None:
    conn.send("ready")
    conn.recv()


def _ignores_sigterm(conn) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.send("ready")
    while True:
        time.sleep(1)


def _sleeps(conn) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever handler the test process had (Ray installs one)
    conn.send("ready")
    while True:
        time.sleep(1)


def _start(target):
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(child,), daemon=True)
    p.start()
    assert parent.recv() == "ready"
    return p, parent


def test_a_process_that_exits_within_the_join_timeout_gets_no_signal():
    polite, polite_conn = _start(_exits_when_told)
    polite_conn.send("go")
    processes.stop_processes([polite], join_timeout=30.0)  # returns as soon as it has exited
    assert not polite.is_alive() and polite.exitcode == 0


def test_a_process_that_ignores_sigterm_is_killed():
    stubborn, _ = _start(_ignores_sigterm)
    processes.stop_processes([stubborn], join_timeout=0.5, kill_timeout=0.5)
    assert not stubborn.is_alive() and stubborn.exitcode == -signal.SIGKILL


def test_no_join_timeout_signals_at_once_and_sigterm_is_enough():
    sleepers = [_start(_sleeps)[0] for _ in range(3)]
    processes.stop_processes(sleepers, kill_timeout=30.0)  # returns as soon as they are gone
    assert [p.exitcode for p in sleepers] == [-signal.SIGTERM] * 3


def test_stopping_processes_already_dead_is_a_no_op():
    polite, conn = _start(_exits_when_told)
    conn.send("go")
    polite.join()
    processes.stop_processes([polite], join_timeout=1.0)
    assert polite.exitcode == 0


def test_mp_context_sets_one_preload_list():
    ctx = processes.mp_context(atari=False, extra=["agents.ppo", "torch"])
    assert ctx.get_start_method() == "forkserver"
    assert multiprocessing.forkserver._forkserver._preload_modules == [*processes.PRELOAD, "agents.ppo"]
    processes.mp_context()
    assert multiprocessing.forkserver._forkserver._preload_modules == processes.PRELOAD + processes.ATARI_PRELOAD


def test_only_continual_processes_sets_the_preload_list():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(["git", "grep", "-l", "set_forkserver_preload", "--", "continual", "agents", ":(glob)*.py"],
                         cwd=root, capture_output=True, text=True).stdout.split()
    assert out == ["continual/processes.py"], out
    assert sys.modules["continual.processes"] is processes
