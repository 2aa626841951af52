"""Helpers shared by the benchmark scripts: machine info, statistics, tables, JSON output, process inspection."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from importlib import metadata
from typing import Any, Iterable, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # `python bench/x.py` puts bench/ first; the library lives in the repository root
    sys.path.insert(0, REPO_ROOT)

from continual import console  # noqa: E402
from continual.testing.processes import alive, descendants  # noqa: E402,F401  (the bench scripts use them as common.*)

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


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != x:
        return "nan"
    return f"{x:,.{digits}f}"


# --- output -------------------------------------------------------------------------------------------------------


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    console.print_table(title, columns, rows, width=160)


def run_worker(cmd: Sequence[str], name: str, log: str, out: str, timeout: float, failures: list[dict],
               env: Optional[dict[str, str]] = None) -> Optional[dict[str, Any]]:
    """One benchmark run in a subprocess (stdout+stderr to `log`, result JSON at `out`): the result, or None after
    recording and printing the failure."""
    import subprocess

    with open(log, "w", encoding="utf-8") as lf:
        rc = subprocess.run(list(cmd), stdout=lf, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
                            timeout=timeout).returncode
    if rc != 0 or not os.path.exists(out):
        with open(log, encoding="utf-8") as lf:
            tail = lf.read()[-3000:]
        failures.append({"run": name, "rc": rc, "log_tail": tail})
        print(f"  {name}: FAILED (rc={rc})\n{tail}", flush=True)
        return None
    with open(out, encoding="utf-8") as f:
        return json.load(f)


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

    def _tree_ticks(self) -> dict[int, float]:
        out = {}
        for pid in descendants(self.root) | {self.root}:
            t = _proc_ticks(pid)
            if t is not None:
                out[pid] = t
        return out

    def _run(self) -> None:
        import time as _time

        last_t, (last_busy, last_steal), last_tree = _time.monotonic(), _cpu_times(), self._tree_ticks()
        while not self._stop.wait(self.interval):
            now, (busy, steal), tree = _time.monotonic(), _cpu_times(), self._tree_ticks()
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
