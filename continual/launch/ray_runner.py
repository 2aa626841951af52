"""Ray: start a local instance (or join a cluster), and the task that runs one training command as a subprocess.

The training CLI runs as a child process of the Ray task, so a crash of a run (segfault, OOM kill, exit code) is the
child's exit status, never the worker's. The child gets SIGKILL when its parent worker dies (prctl
PR_SET_PDEATHSIG): a run never outlives its task, so a run resumed elsewhere after its node died has its run
directory to itself. The launcher stops a run by creating its stop file (in the experiment folder, seen by every
node): the task sends SIGTERM, and the training CLI saves an `interrupted` checkpoint and exits.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence

from continual.errors import StorageError, one_line
from continual.machine import record_launch

# ray is imported inside functions: `python -m continual.launch --help` and validation stay fast


_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_saved_handlers: dict = {}


def start(address: Optional[str], num_cpus: Optional[int], object_store_mb: int, temp_dir: Optional[str] = None
          ) -> None:
    import ray

    # ray.init installs its own SIGTERM handler (exit code 1) in this process: `stop` puts ours back, so that a
    # caller running the launcher in-process (tests, notebooks) and the processes it forks keep their behaviour
    _saved_handlers.update({s: signal.getsignal(s) for s in _SIGNALS})

    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local": a new instance of our own, even when `ray start` left one running on this machine
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, object_store_memory=object_store_mb * 1024 * 1024,
                 _temp_dir=temp_dir, **kwargs)


def stop() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    for s, handler in _saved_handlers.items():
        if handler is not None:
            signal.signal(s, handler)
    _saved_handlers.clear()


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setsid()  # its own process group: SIGTERM/SIGKILL reach the env workers too
    _keep_nice_in_new_autogroup()


def _keep_nice_in_new_autogroup() -> None:
    """A new session is a new scheduling autogroup on Linux (sched_autogroup_enabled), and autogroups share the CPU by
    their own nice value, not their processes': without this, `nice python -m continual.launch ...` would run every
    training at full priority against the user's shell. Lowering priority needs no privilege."""
    niceness = os.nice(0)
    if niceness <= 0:
        return
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(min(niceness, 19)))
    except OSError:  # no autogroups (other kernels, containers without /proc write access): nothing to carry
        pass


def run_command(argv: Sequence[str], log_path: str, env: dict, cwd: str, stop_path: str,
                run_dirs: Sequence[str] = ()) -> dict:
    """Run `python argv...` with stdout and stderr appended to log_path; returns exit code, host, node, and whether
    it was stopped (the launcher creates `stop_path` to stop it: SIGTERM, so the run saves a checkpoint). Each of
    `run_dirs` (the runs the command starts or resumes) gets this launch and machine in its launches.jsonl once it
    exists (a new run's directory is made by the run itself)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    stopped = False
    unrecorded = list(run_dirs)
    with open(log_path, "ab", buffering=0) as log:
        log.write(f"\n=== launch: {time.strftime('%Y-%m-%d %H:%M:%S')} host {host} node {node[:12]} pid "
                  f"{os.getpid()}: {' '.join(argv)}\n".encode())
        started = time.time()  # before the run's own start record, which the launch record must precede
        proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env={**os.environ, **env}, preexec_fn=_die_with_parent)
        try:
            while True:
                unrecorded = _record_launches(unrecorded, started, node[:12], log)
                try:
                    rc = proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if os.path.exists(stop_path):
                        stopped = True
                        os.killpg(proc.pid, signal.SIGTERM)
                        try:
                            rc = proc.wait(timeout=120)
                        except subprocess.TimeoutExpired:
                            os.killpg(proc.pid, signal.SIGKILL)
                            rc = proc.wait()
                        break
        except BaseException:  # cancelled: the run must not outlive its task
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
        _record_launches(unrecorded, started, node[:12], log)  # directories made less than a poll before the end
        what = "stopped by the launcher, " if stopped else ""
        log.write(f"=== launch: {time.strftime('%Y-%m-%d %H:%M:%S')} {what}exit code {rc}\n".encode())
    return {"returncode": rc, "host": host, "node": node, "stopped": stopped}


def _record_launches(run_dirs: list[str], started: float, node: str, log) -> list[str]:
    """Record the launch in those of `run_dirs` that exist; the others, to try again. A record that cannot be written
    (a full disk) is noted in the log and not retried: it is provenance, and the run goes on without it."""
    left = []
    for d in run_dirs:
        if not os.path.isdir(d):
            left.append(d)
            continue
        try:
            record_launch(d, started, node)
        except (OSError, StorageError) as e:
            log.write(f"=== launch: {one_line(str(e))[:300]}\n".encode())
    return left


def remote_run(num_cpus: float, num_gpus: float):
    """`run_command` as a Ray task needing these resources (Ray never re-runs it itself: the launcher decides)."""
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)(run_command)


def node_of(host_and_node: dict) -> str:
    return f"{host_and_node.get('host', '?')}:{str(host_and_node.get('node', ''))[:6]}"
