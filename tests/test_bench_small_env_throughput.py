"""bench/small_env_throughput.py: the CPU seconds per iteration it reads while a run trains, on a real process."""

from __future__ import annotations

import os
import sys

from conftest import load_bench

small = load_bench("small_env_throughput")


def test_iteration_cpu_reads_the_process_cpu_as_each_iteration_is_logged(tmp_path):
    """A process that logs an iteration record after each ~0.15 CPU-second of work (episode records between them,
    a record written in two pieces): the watch sees iterations 1..3, at CPU times that grow by about that work."""
    script = (
        "import json, os, sys, time\n"
        "f = open(os.path.join(sys.argv[1], 'metrics.jsonl'), 'w', buffering=1)\n"
        "for i in range(3):\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < 0.15: pass\n"
        "    f.write(json.dumps({'kind': 'episode', 'global_step': i}) + '\\n')\n"
        "    line = json.dumps({'kind': 'iteration', 'global_step': i}) + '\\n'\n"
        "    f.write(line[:9]); f.flush(); time.sleep(0.05); f.write(line[9:])\n"
        "    time.sleep(0.05)\n")
    r = small.common.run([sys.executable, "-c", script, str(tmp_path)],
                         watch=small.iteration_cpu(str(tmp_path)))
    marks = r["watch"]
    assert sorted(marks) == [1, 2, 3]
    steps = [marks[2] - marks[1], marks[3] - marks[2]]
    assert all(0.1 <= s <= 0.5 for s in steps), marks
    assert os.path.exists(tmp_path / "metrics.jsonl")
