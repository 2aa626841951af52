"""Benchmark helper: where a run's CPU time goes, process by process (learner, IMPALA actors, env workers,
evaluators, the forkserver).

Runs the command given after `--`, samples the CPU seconds (utime + stime from /proc) of every process of its tree
every `--interval` seconds, and prints each process's last sample with its command line, and the total. A process
that ends between two samples loses at most one interval of its time.

    python bench/process_cpu.py -- python continual_training_example.py --config C --total_timesteps 100000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command after --")
    hz = os.sysconf("SC_CLK_TCK")
    proc = subprocess.Popen(command)
    seen: dict[int, tuple[str, float]] = {}
    t0 = time.time()
    while proc.poll() is None:
        for pid in common.descendants(proc.pid) | {proc.pid}:
            ticks = common._proc_ticks(pid)
            if ticks is not None:
                seen[pid] = (seen[pid][0] if pid in seen else cmdline(pid), ticks / hz)
        time.sleep(args.interval)
    wall = time.time() - t0
    rows = [[f"{cpu:.1f}", str(pid), cmd[:110]] for pid, (cmd, cpu) in sorted(seen.items(), key=lambda kv: -kv[1][1])]
    common.print_table(f"CPU seconds by process (wall {wall:.1f} s, exit {proc.returncode}, load {common.loadavg()})",
                       ["CPU s", "pid", "command"], rows)
    print(f"total {sum(cpu for _, cpu in seen.values()):.1f} CPU s")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
