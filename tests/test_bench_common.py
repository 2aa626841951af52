"""bench/common.py: the one run helper (exit status, output tail, environment, CPU and
load sampling) on real processes, and the metrics reader and steady-state rate on hand-made run directories."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from conftest import load_bench

common = load_bench("common")


def test_rotation_rotates_by_one_per_repeat():
    assert [common.rotation(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert [common.rotation(["x", "y"], r) for r in range(3)] == [["x", "y"], ["y", "x"], ["x", "y"]]


def test_run_records_exit_status_output_and_environment(tmp_path):
    log = str(tmp_path / "ok.log")
    code = "import os; print(os.environ['WANDB_MODE'], os.environ['OMP_NUM_THREADS'], os.environ['X'])"
    r = common.run([sys.executable, "-c", code], log=log, threads=1, env={"X": "y"}, nice=1, sample_load=True)
    assert r["rc"] == 0 and r["command"][:3] == ["nice", "-n", "1"] and r["wall_s"] > 0
    assert open(log).read() == "disabled 1 y\n"
    assert r["cpu_s"] > 0 and "foreign_cores" in r and "log_tail" not in r
    bad = [sys.executable, "-c", "import sys; print('the cause'); sys.exit(3)"]
    with pytest.raises(common.RunFailed, match="exit status 3") as e:
        common.run(bad)
    assert "the cause" in str(e.value)
    r = common.run(bad, check=False)
    assert r["rc"] == 3 and r["log_tail"] == "the cause\n"


def test_run_watch_sees_the_running_process_and_a_timeout_kills_it():
    r = common.run([sys.executable, "-c", "import time; time.sleep(0.3)"], watch=lambda p: p.poll() is None)
    assert r["watch"] is True
    failures: list = []
    with pytest.raises(Exception, match="timed out"):
        common.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert common.run_worker([sys.executable, "-c", "pass"], "w", os.devnull, "/nonexistent.json", 10, failures) is None
    assert failures == [{"run": "w", "rc": 0, "log_tail": ""}]


def write_metrics(run_dir, records, cut: str = "") -> str:
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(cut)
    return str(run_dir)


def test_iteration_cpu_s_reads_the_process_cpu_as_iteration_records_are_logged(tmp_path):
    """A process that logs an iteration record after each ~0.15 CPU-second of work (episode records between them,
    each iteration record written in two pieces): the CPU seconds between its 1st and 3rd iteration are about two
    pieces of work, and a run that ends before its 5th gives None."""
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
    cmd = [sys.executable, "-c", script, str(tmp_path)]
    r = common.run(cmd, watch=lambda proc: common.iteration_cpu_s(proc, str(tmp_path), 1, 3))
    assert 0.2 <= r["watch"] <= 0.8, r["watch"]
    assert common.run(cmd, watch=lambda proc: common.iteration_cpu_s(proc, str(tmp_path), 1, 5))["watch"] is None


def test_iteration_cpu_s_of_the_tree_counts_the_worker_processes(tmp_path):
    """A process whose child burns the CPU while the parent logs its iteration records: the parent's own CPU between
    two records is near 0, the tree's holds the child's."""
    script = (
        "import json, os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "f = open(os.path.join(sys.argv[1], 'metrics.jsonl'), 'w', buffering=1)\n"
        "for i in range(3):\n"
        "    time.sleep(0.6)\n"
        "    f.write(json.dumps({'kind': 'iteration', 'global_step': i}) + '\\n')\n"
        "time.sleep(0.3)\n"
        "child.kill()\n")
    cpu = {}
    for tree in (False, True):
        (tmp_path / str(tree)).mkdir()
        run_dir = str(tmp_path / str(tree))
        cpu[tree] = common.run([sys.executable, "-c", script, run_dir],
                               watch=lambda proc: common.iteration_cpu_s(proc, run_dir, 1, 3, tree=tree))["watch"]
    assert cpu[False] < 0.1 and cpu[True] > cpu[False] + 0.1, cpu


def test_metrics_drops_a_line_cut_by_a_crash_and_filters_by_kind(tmp_path):
    recs = [{"kind": "iteration", "global_step": 8}, {"kind": "episode", "global_step": 9, "return": 1.0}]
    d = write_metrics(tmp_path / "run", recs, cut='{"kind": "iteration", "glo')
    assert common.metrics(d) == recs
    assert common.metrics(d, "episode") == recs[1:]
    bad = write_metrics(tmp_path / "bad", [], cut='{"kind": "iter\n{"kind": "episode"}\n')
    with pytest.raises(Exception, match="only the last line may be cut"):
        common.metrics(bad)


def test_steady_rate_by_hand():
    its = [{"global_step": 100 * i, "time": t, "time/env_s": 1.0, "time/act_s": 0.5, "time/learn_s": 2.0}
           for i, t in ((1, 10.0), (2, 13.0), (3, 15.0), (4, 19.0))]
    # warm-up 1: from the end of iteration 1 (step 100, t 10) to the last (step 400, t 19); iterations 2-4 summed
    assert common.steady(its) == {"steps": 300, "seconds": 9.0, "sps": 300 / 9.0, "env_s": 3.0, "act_s": 1.5,
                                  "learn_s": 6.0}
    assert common.steady(its, warmup=2)["sps"] == 200 / 6.0
    assert set(common.steady([{"global_step": 1, "time": 0.0}, {"global_step": 3, "time": 1.0}])) == {
        "steps", "seconds", "sps"}
    assert math.isnan(common.steady([{"global_step": 1, "time": 0.0}] * 2)["sps"])


def test_revision_tree_checks_out_the_revision_and_removes_it(tmp_path):
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=common.REPO_ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    sha = common.resolve_revision("HEAD")
    assert sha == head.stdout.strip()
    assert common.resolve_revision("no-such-revision-xyz") is None
    with common.revision_tree(sha, str(tmp_path)) as tree:
        assert os.path.isfile(os.path.join(tree, "bench", "common.py"))
        at = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
        assert at == sha
    assert not os.path.exists(tree)
    listed = subprocess.run(["git", "worktree", "list"], cwd=common.REPO_ROOT, capture_output=True, text=True).stdout
    assert tree not in listed
