"""Helpers shared by the benchmark scripts: machine info, statistics, tables, JSON output, process inspection, the
one way to run a benchmark process (`run`, `train_command`) and to read a run's metrics (`metrics`, `steady`)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any, Callable, Iterable, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # `python bench/x.py` puts bench/ first; the library lives in the repository root
    sys.path.insert(0, REPO_ROOT)

from continual import console  # noqa: E402
from continual.testing.processes import alive, descendants  # noqa: E402,F401  (the bench scripts use them as common.*)
from continual.training.tracking import read_metrics  # noqa: E402

PACKAGES = ("torch", "gymnasium", "ale-py", "hackatari", "ocatari", "stable-baselines3", "numpy")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine_info() -> dict[str, Any]:
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = "not installed"
    try:
        import torch

        threads = torch.get_num_threads()
    except ImportError:
        threads = None
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": threads,
        "loadavg_start": loadavg(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS") if k in os.environ},
        "versions": versions,
    }


# --- statistics ---------------------------------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def rotation(names: Sequence[str], repeat: int) -> list[str]:
    """The order of round-robin repeat `repeat`: `names` rotated by one per repeat (two kinds: they alternate)."""
    k = repeat % len(names) if names else 0
    return [*names[k:], *names[:k]]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != x:
        return "nan"
    return f"{x:,.{digits}f}"


# --- another revision of this repository --------------------------------------------------------------------------


def resolve_revision(rev: str) -> Optional[str]:
    """The commit `rev` names in this repository, or None."""
    out = subprocess.run(["git", "rev-parse", "--verify", rev + "^{commit}"], cwd=REPO_ROOT, capture_output=True,
                         text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def revision_or_exit(parser, rev: str) -> str:
    """The commit `rev` names, or the parser's usage error (exit 2) for the `--base` flag."""
    sha = resolve_revision(rev)
    if sha is None:
        parser.error(f"--base: not a git revision here: {rev}")
    return sha


@contextlib.contextmanager
def revision_tree(sha: str, tmp: str):
    """A detached git worktree of `sha` under `tmp` (the baseline of a same-run A/B), removed afterwards."""
    tree = os.path.join(tmp, "base")
    subprocess.run(["git", "worktree", "add", "--detach", tree, sha], cwd=REPO_ROOT, check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO_ROOT, capture_output=True)


# --- output -------------------------------------------------------------------------------------------------------


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    console.print_table(title, columns, rows, width=160)


# --- running benchmark processes ----------------------------------------------------------------------------------


class RunFailed(subprocess.CalledProcessError):
    """A benchmark process exited with an error (a CalledProcessError: `returncode`, `cmd`, `output`, its output's
    tail); its message ends with that tail."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.output}"


def train_command(flags: Sequence[str], runs_dir: str, name: str,
                  script: str = "continual_training_example.py") -> list[str]:
    """The command of one training run of this tree: `python <script> <flags>` into `<runs_dir>/<name>`."""
    return [sys.executable, script, *flags, "--runs_dir", runs_dir, "--run_name", name, "--no-progress-bar"]


def run(cmd: Sequence[str], *, log: Optional[str] = None, log_mode: str = "w", env: Optional[dict[str, str]] = None,
        nice: Optional[int] = None, threads: Optional[int] = None, timeout: Optional[float] = None,
        cwd: str = REPO_ROOT, sample_load: bool = False, watch: Optional[Callable[[subprocess.Popen], Any]] = None,
        check: bool = True, expect_rc: int = 0) -> dict[str, Any]:
    """Runs one benchmark process to its end and says what it cost.

    `cmd` runs in `cwd` (under `nice -n <nice>`), stdout and stderr to `log` (opened with `log_mode`: "a" appends;
    None: a temporary file, kept only to show its tail on failure), with os.environ + WANDB_MODE=disabled + `env` (+ OMP_NUM_THREADS=`threads`).
    `watch(proc)`, if given, runs while the process does (e.g. reading its CPU ticks) and its result is "watch".
    With `sample_load`, a LoadSampler adds "cpu_s" (our process tree's CPU seconds: forkserver children included,
    which RUSAGE_CHILDREN misses) and "foreign_cores" (other processes' load meanwhile).
    Returns {"command", "rc", "wall_s", "loadavg_start", "loadavg_end", ...}; an exit status other than `expect_rc`
    raises RunFailed with check, else prints the output's tail and returns the record (its "log_tail" set).
    """
    cmd = [*(["nice", "-n", str(nice)] if nice is not None else []), *cmd]
    full_env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    if threads is not None:
        full_env["OMP_NUM_THREADS"] = str(threads)
    out: dict[str, Any] = {"command": cmd, "loadavg_start": loadavg()}
    sampler = LoadSampler(interval=1.0) if sample_load else None
    t0, ru0 = time.time(), _children_cpu()
    with (open(log, log_mode + "+", encoding="utf-8") if log else tempfile.TemporaryFile("w+", encoding="utf-8")) as lf:
        start = lf.tell()
        with sampler or contextlib.nullcontext():
            proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=lf, stderr=subprocess.STDOUT)
            try:
                if watch is not None:
                    out["watch"] = watch(proc)
                out["rc"] = proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:  # a timeout, or an error in watch: the process does not outlive us
                    proc.kill()
                    proc.wait()
        out["wall_s"], out["loadavg_end"] = time.time() - t0, loadavg()
        if sampler:
            tree = sum(x["ours_cores"] * (x["t"] - x["t0"]) for x in sampler.samples)
            out["cpu_s"] = max(tree, _children_cpu() - ru0)
            out["foreign_cores"] = sampler.summary()["foreign_cores"]
        if out["rc"] != expect_rc:
            lf.seek(start)
            out["log_tail"] = lf.read()[-3000:]
    if out["rc"] != expect_rc:
        if check:
            raise RunFailed(out["rc"], cmd, out["log_tail"])
        print(f"  FAILED: {' '.join(map(str, cmd))}: exit {out['rc']}{f', log {log}' if log else ''}\n"
              f"{out['log_tail']}", flush=True)
    return out


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_worker(cmd: Sequence[str], name: str, log: str, out: str, timeout: float, failures: list[dict],
               env: Optional[dict[str, str]] = None) -> Optional[dict[str, Any]]:
    """A worker process that writes its result as JSON to `out` (`run`, output to `log`): the result, or None after
    recording and printing the failure."""
    r = run(cmd, log=log, env=env, timeout=timeout, check=False)
    if r["rc"] != 0 or not os.path.exists(out):
        failures.append({"run": name, "rc": r["rc"], "log_tail": r.get("log_tail", "")})
        if r["rc"] == 0:
            print(f"  {name}: FAILED (no result file {out})", flush=True)
        return None
    with open(out, encoding="utf-8") as f:
        return json.load(f)


# --- reading a run ------------------------------------------------------------------------------------------------


def metrics(run_dir: str, kind: Optional[str] = None) -> list[dict]:
    """A run's metrics.jsonl records, of one `kind` if given (the library's reader: a last line cut by a crash is
    dropped, any other damaged line is an error)."""
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    return records if kind is None else [r for r in records if r.get("kind") == kind]


def steady(iterations: Sequence[dict], warmup: int = 1) -> dict[str, float]:
    """Steady-state rate from iteration records: steps and seconds between the end of iteration `warmup` (1-based)
    and the end of the last (start-up and the first iterations excluded), their ratio "sps", and the env / act /
    learn seconds of the iterations in between ("env_s", ...) where the records have them."""
    a, b = iterations[warmup - 1], iterations[-1]
    out = {"steps": b["global_step"] - a["global_step"], "seconds": b["time"] - a["time"]}
    out["sps"] = ratio(out["steps"], out["seconds"])
    for k in ("env", "act", "learn"):
        if all(f"time/{k}_s" in r for r in iterations[warmup:]):
            out[f"{k}_s"] = sum(r[f"time/{k}_s"] for r in iterations[warmup:])
    return out


def print_machine(info: dict[str, Any]) -> None:
    rows = [["date", info["date"]], ["nproc", info["nproc"]], ["cpu", info["cpu_model"]],
            ["python", info["python"]], ["torch threads", info["torch_threads"]],
            ["load average (start)", info["loadavg_start"]]]
    if "loadavg_end" in info:
        rows.append(["load average (end)", info["loadavg_end"]])
    rows += [[k, v] for k, v in info.get("env", {}).items()]
    rows += [[k, v] for k, v in info["versions"].items()]
    print_table("machine", ["item", "value"], rows)


def write_json(path: Optional[str], data: dict[str, Any]) -> None:
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
    print(f"results written to {path}")


# --- CPU load of other processes ----------------------------------------------------------------------------------


def _cpu_times() -> tuple[float, float]:
    """(busy, steal) clock ticks of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat", encoding="utf-8") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (vals + [0] * 8)[:8]
    return float(user + nice + system + irq + softirq), float(steal)


def _proc_ticks(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    rest = data[data.rfind(")") + 2:].split()
    return float(int(rest[11]) + int(rest[12]))  # utime + stime


def iteration_cpu_s(proc, run_dir: str, first: int, last: int, tree: bool = False) -> Optional[float]:
    """A training process's CPU seconds (utime + stime) between its `first`-th and `last`-th iteration records in
    `run_dir`/metrics.jsonl, looked for every 10 ms while it runs (None if it ends before both): start-up excluded, and
    on a loaded machine less variable than wall time. With `tree`, its live descendants' too (env worker processes)."""
    path, marks, n, offset = os.path.join(run_dir, "metrics.jsonl"), {}, 0, 0
    while last not in marks and proc.poll() is None:
        time.sleep(0.01)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                new = f.read()
        except OSError:
            continue
        new = new[:new.rfind(b"\n") + 1]  # whole records only
        offset += len(new)
        n += new.count(b'"kind": "iteration"')
        for k in (first, last):
            if n >= k and k not in marks:
                ticks = tree_ticks(proc.pid) if tree else {proc.pid: _proc_ticks(proc.pid)}
                if ticks.get(proc.pid) is not None:
                    marks[k] = sum(t for t in ticks.values() if t is not None)
    return (marks[last] - marks[first]) / os.sysconf("SC_CLK_TCK") if len(marks) == 2 else None


def tree_ticks(root: int) -> dict[int, float]:
    """CPU clock ticks of `root` and its live descendants, by pid."""
    ticks = {pid: _proc_ticks(pid) for pid in descendants(root) | {root}}
    return {pid: t for pid, t in ticks.items() if t is not None}


class LoadSampler:
    """Samples, in a background thread, how many CPU cores our process tree and all other processes use.

    `foreign_cores` = machine busy time - our tree's busy time, per second of wall time; `steal_cores` = time the
    hypervisor gave to other guests. Both explain slow, noisy measurements on a shared machine.
    """

    def __init__(self, interval: float = 0.5):
        import threading

        self.interval = interval
        self.root = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples: list[dict[str, float]] = []
        self._hz = os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        import time as _time

        last_t, (last_busy, last_steal), last_tree = _time.monotonic(), _cpu_times(), tree_ticks(self.root)
        while not self._stop.wait(self.interval):
            now, (busy, steal), tree = _time.monotonic(), _cpu_times(), tree_ticks(self.root)
            ours = sum(v - last_tree.get(pid, 0.0) for pid, v in tree.items())
            dt = now - last_t
            if dt > 0:
                wall = _time.time()
                self.samples.append({"t0": wall - dt, "t": wall, "ours_cores": ours / self._hz / dt,
                                     "foreign_cores": max(0.0, (busy - last_busy - ours) / self._hz / dt),
                                     "steal_cores": (steal - last_steal) / self._hz / dt})
            last_t, last_busy, last_steal, last_tree = now, busy, steal, tree

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, t0: Optional[float] = None, t1: Optional[float] = None) -> dict[str, float]:
        # samples whose interval overlaps [t0, t1]
        s = [x for x in self.samples if (t0 is None or x["t"] >= t0) and (t1 is None or x["t0"] <= t1)]
        if not s:
            return {"ours_cores": float("nan"), "foreign_cores": float("nan"), "steal_cores": float("nan")}
        return {k: sum(x[k] for x in s) / len(s) for k in ("ours_cores", "foreign_cores", "steal_cores")}
