"""A training run killed at a planned moment (a continual.testing.faults test hook, or a SIGKILL sent by the test) and what a
clean stop looks like from outside: the trainer exits within KILL_TO_EXIT_S of the kill, and no process of its
session (learner, forkserver, actors / env workers, resource tracker) is left. The tests check the one-line error and
the checkpoint it names."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from conftest import ROOT
from continual.testing.processes import group
from helpers.trainer_faults import faulty

KILL_TO_EXIT_S = 30.0  # the trainer must be gone this long after the kill (a hang never gets there)


@dataclasses.dataclass
class KilledRun:
    returncode: int
    stderr: str
    point: str  # the fault point that fired ("test": killed by the test)
    killed_pid: int
    kill_to_exit_s: float
    left: list[int]  # processes of the session still alive after the trainer exited

    def describe(self) -> str:
        return f"killed at {self.point} (pid {self.killed_pid}), exit {self.returncode}:\n{self.stderr[-3000:]}"


def run_killed(argv: list[str], workdir: str, fault: Optional[str], kill: Optional[Callable[[], Optional[int]]] = None,
               start_timeout: float = 300.0) -> KilledRun:
    """Run `python argv` in its own session with CONTINUAL_FAULT=`fault`; or call `kill()` every 50 ms until it kills
    a process and returns its pid. Waits at most `start_timeout` for the kill, then KILL_TO_EXIT_S for the exit."""
    log = os.path.join(workdir, "faults.log")
    env = {**os.environ, "WANDB_MODE": "offline", "CONTINUAL_FAULT": fault or "", "CONTINUAL_FAULT_LOG": log}
    with open(os.path.join(workdir, "stderr.txt"), "w+") as err, open(os.path.join(workdir, "stdout.txt"), "w") as out:
        proc = subprocess.Popen([sys.executable, *faulty(argv, env)], cwd=ROOT, env=env, stdout=out, stderr=err, text=True,
                                start_new_session=True)
        try:
            killed: Optional[tuple[float, str, int]] = None
            deadline = time.time() + start_timeout
            while proc.poll() is None:
                if killed is None and kill is not None:
                    pid = kill()
                    if pid is not None:
                        killed = (time.time(), "test", pid)
                if killed is None and os.path.exists(log):
                    with open(log) as f:
                        first = f.readline().split()
                    if len(first) == 3:
                        killed = (float(first[0]), first[1], int(first[2]))
                if killed is not None:
                    deadline = min(deadline, killed[0] + KILL_TO_EXIT_S)
                if time.time() > deadline:
                    what = "the planned kill never happened" if killed is None else \
                        f"still running {KILL_TO_EXIT_S:.0f} s after the kill at {killed[1]} (pid {killed[2]}): a hang"
                    raise AssertionError(f"{what}; stderr:\n{_tail(err)}")
                time.sleep(0.05)
            exit_time = time.time()
            if killed is None and os.path.exists(log):  # killed and gone between two looks
                with open(log) as f:
                    first = f.readline().split()
                killed = (float(first[0]), first[1], int(first[2]))
            assert killed is not None, f"exited ({proc.returncode}) before the planned kill; stderr:\n{_tail(err)}"
            left = _wait_group_gone(proc.pid, 15.0)
            return KilledRun(proc.returncode, _tail(err, None), killed[1], killed[2], exit_time - killed[0], left)
        finally:
            for pid in group(proc.pid):  # whatever happened, leave nothing running behind the test
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()


def _tail(f, n: Optional[int] = 3000) -> str:
    f.flush()
    f.seek(0)
    text = f.read()
    return text if n is None else text[-n:]


def _wait_group_gone(pgid: int, timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while True:
        left = sorted(group(pgid))
        if not left or time.time() > deadline:
            return left
        time.sleep(0.1)
