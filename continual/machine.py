"""Which machine ran a run's steps: its CPU model and vector instruction sets, recorded at every start and resume.

Two virtual machines that both call their CPU "AMD EPYC" ran the C-CHAIN experiment's Double DQN at 127 and 34 steps
a second per seed (one with AVX-512, one with AVX2 only; docs/experiments.md), and oneDNN and ATen choose their
kernels by instruction set, so the same resumed state computes different bits on each. A run that moves between
machines therefore records each one:

- the training CLI's `kind: "start"` record (continual/training/startup.py) holds `machine`;
- the launcher also appends one record per launch to the run directory's `launches.jsonl` (`record_launch`), which
  covers runs whose code predates the start record's field (a run pinned to an older revision with `--code`);
- `starts_with_machines` gives each start record its machine: its own, else the launcher's newest launch at or before
  it. The reports' provenance lists the machines and the steps each run started at on each
  (continual/evaluation/metrics.py).
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
from typing import Optional, Sequence

from continual.io import AppendFile, read_jsonl

LAUNCHES = "launches.jsonl"

# The flags that decide which kernels oneDNN and ATen run (x86: SSE4.1 < AVX2 < AVX-512 < AMX; ARM: NEON < SVE)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def machine() -> dict:
    """{"cpu": the CPU's model name, "isa": the ISA_FLAGS it has, in ISA_FLAGS' order, "cores": the cores this
    process may use, "system": OS and architecture}."""
    model, flags = _cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)
    return {"cpu": model or platform.processor() or "unknown", "isa": [f for f in ISA_FLAGS if f in flags],
            "cores": cores, "system": f"{platform.system()} {platform.machine()}"}


def describe(m: Optional[dict]) -> str:
    """One line for a report: "AMD EPYC (avx2; 2 cores)"; "not recorded" for None."""
    if not m:
        return "not recorded"
    return f"{m.get('cpu', 'unknown')} ({' '.join(m.get('isa') or []) or 'no listed vector ISA'}; {m.get('cores', '?')} cores)"


def record_launch(run_dir: str, started: float, node: str = "") -> None:
    """Append the launch that started at `started` (time.time()) on this machine to `run_dir`'s launches.jsonl."""
    f = AppendFile(os.path.join(run_dir, LAUNCHES), hint="the launch is not recorded; the run goes on")
    try:
        f.write(json.dumps({"kind": "launch", "time": round(started, 3), "host": socket.gethostname(), "node": node,
                            "pid": os.getpid(), "machine": machine()}) + "\n")
    finally:
        f.close()


def starts_with_machines(run_dir: str, records: Sequence[dict]) -> list[dict]:
    """The "start" records of `records` (a run's metrics.jsonl, in order), each with `machine` filled in where it lacks
    one: the machine of the newest launch in `run_dir`'s launches.jsonl at or before the start's time (absent when
    there is none)."""
    launches = sorted((r for r in read_jsonl(os.path.join(run_dir, LAUNCHES)) if r.get("kind") == "launch"),
                      key=lambda r: r.get("time", 0.0))
    out = []
    for rec in (r for r in records if r.get("kind") == "start"):
        before = [r for r in launches if r.get("time", 0.0) <= rec.get("time", math.inf)]
        out.append({**rec, "machine": before[-1]["machine"]} if before and not rec.get("machine") else rec)
    return out
