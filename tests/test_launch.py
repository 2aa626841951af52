"""python -m continual.launch: experiment files and their validation, the claim queue under races, the launcher on
local Ray and on a shared Ray cluster (with a stand-in training script: fast), and, marked slow, real CartPole runs:
a 2 seeds x 2 methods grid with its aggregate, a killed launcher re-run, a two-node cluster losing a node."""

from __future__ import annotations

import csv
import glob
import json
import math
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from continual.errors import UserError, exit_on_user_error
from continual.launch import launcher as L
from continual.launch.experiment import load_experiment, run_config
from continual.launch.queue import FAILED, Queue
from continual.training.checkpoint import step_of
from helpers.launch_runs import CARTPOLE, PY, REPO, attempts, env, fake_script, write

# Local Ray clusters: one at a time, on one test worker.
pytestmark = pytest.mark.xdist_group("ray")


# --- the experiment file ---------------------------------------------------------------------------------------------


def test_grid_expansion_order_names_and_precedence(tmp_path):
    write(tmp_path / "base.json", {**CARTPOLE, "seed": 9, "learning_rate": 0.1, "num_steps": 32})
    other = write(tmp_path / "other.json", {**CARTPOLE, "learning_rate": 0.2})
    exp = write(tmp_path / "e.json", {
        "config": "base.json",  # relative to the experiment file
        "flags": {"num_steps": 16, "total_timesteps": 2048},
        "runs": [{"name": "plain"}, {"name": "sp", "shrink_and_perturb": True, "num_steps": 8}],
        "grid": {"architecture": ["PPO", "PPO_CBP"], "seed": [1, 2]},
    })
    e = load_experiment(exp)
    assert e.name == "e" and len(e.entries) == 2 * 2 * 2
    assert [x.name for x in e.entries[:3]] == ["000_plain_architecture=PPO_seed=1", "001_plain_architecture=PPO_seed=2",
                                               "002_plain_architecture=PPO_CBP_seed=1"]
    sp = e.entries[7]
    assert sp.label == "sp, architecture=PPO_CBP, seed=2"
    # base < flags < runs item < grid
    assert (sp.config["learning_rate"], sp.config["num_steps"], sp.config["seed"], sp.config["architecture"]) == \
        (0.1, 8, 2, "PPO_CBP")
    assert sp.config["shrink_and_perturb"] and not e.entries[0].config.get("shrink_and_perturb")
    cfg = run_config(sp, e.name)
    assert cfg["wandb_group"] == "e" and cfg["progress_bar"] is False and "_config_file" not in cfg
    # grid over config files and over flag variants
    e2 = load_experiment(write(tmp_path / "e2.json", {
        "grid": {"config": ["base.json", str(other)], "flags": [{"name": "lr", "learning_rate": 0.5}, {"gamma": 0.9}]}}))
    assert [x.label for x in e2.entries] == ["config=base, lr", "config=base, gamma=0.9", "config=other, lr",
                                             "config=other, gamma=0.9"]
    assert e2.entries[2].config["learning_rate"] == 0.5 and e2.entries[3].config["learning_rate"] == 0.2


BAD = [
    ({"grid": {"seed": [1]}, "flags": CARTPOLE, "gird": {}}, "unknown key 'gird'; did you mean 'grid'"),
    ({"grid": {"seed": []}, "flags": CARTPOLE}, "grid 'seed' must be a non-empty list"),
    ({"flags": CARTPOLE}, "nothing to run"),
    ({"grid": {"sead": [1, 2]}, "flags": CARTPOLE}, "unknown key 'sead'; did you mean 'seed'"),
    ({"grid": {"seed": [1]}, "flags": {**CARTPOLE, "runs_dir": "x"}}, "'runs_dir' is set by the launcher"),
    ({"grid": {"seed": [1]}, "flags": {**CARTPOLE, "num_envs": "two"}}, "entry 0 (seed=1): num_envs: expected an integer"),
    ({"grid": {"architecture": ["PPO", "SAC"]}, "flags": CARTPOLE}, "entry 1 (architecture=SAC): architecture: must be one"),
    # refused by the training CLI's preflight: a modification the environment does not have
    ({"grid": {"seed": [1], "modifs": ["", "gravityy=3"]}, "flags": CARTPOLE},
     "entry 1 (seed=1, modifs=gravityy=3): "),
    ({"grid": {"seed": [1]}, "flags": CARTPOLE, "max_retries": -1}, "max_retries must be an integer >= 0"),
    ({"grid": {"seed": [1]}, "flags": CARTPOLE, "seeds_per_process": 0}, "seeds_per_process must be an integer >= 1"),
    ({"grid": {"architecture": ["DQN", "PPO"], "seed": [1, 2]}, "flags": CARTPOLE, "seeds_per_process": 2},
     "entry 2 (architecture=PPO, seed=1): seeds_per_process: only DQN runs are grouped"),
    ({"grid": {"seed": [1, 2]}, "flags": {**CARTPOLE, "architecture": "DQN", "layer_norm": True},
      "seeds_per_process": 2}, "entry 0 (seed=1): seeds_per_process: layer_norm: not batched across seeds"),
]


@pytest.mark.parametrize("data,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_malformed_experiment_is_one_line_and_exit_2_before_anything(tmp_path, capsys, data, message):
    exp = write(tmp_path / "bad.json", data)
    folder = tmp_path / "folder"
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(L.main)([exp, "--folder", str(folder)])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not folder.exists() and sorted(os.listdir(tmp_path)) == ["bad.json"]


PLACEHOLDERS = {"V": {"value": None, "set_by": "pilot.json", "rule": "the smallest budget that learns",
                      "dry_run": 1024}}
SEQUENCE = {**CARTPOLE, "total_timesteps": "4*$V", "eval_every": "$V/4", "modification_factory": "Sequential",
            "modification_factory_kwargs": {"num_total_steps": "4*$V", "modifications": ["", "gravity=15", "", "gravity=5"],
                                            "switching_thresholds": ["$V", "2*$V", "3*$V"]}}


def test_a_placeholder_refuses_a_launch_until_it_is_set_and_a_dry_run_uses_its_stand_in(tmp_path, capsys):
    data = {"placeholders": PLACEHOLDERS, "flags": SEQUENCE, "grid": {"seed": [1, 2]}}
    exp = write(tmp_path / "e.json", data)
    folder = tmp_path / "folder"
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(L.main)([exp, "--folder", str(folder)])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err.count("\n") == 1 and not folder.exists()
    assert "the placeholder V is not set yet: pilot.json sets it (the smallest budget that learns)" in err, err
    assert exit_on_user_error(L.main)([exp, "--folder", str(folder), "--dry_run"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console folds long lines
    assert "placeholder V: not set yet (pilot.json sets it); this dry run used the stand-in 1,024" in out
    assert not folder.exists()
    # substituted at any depth, as integers: k*V, V/d
    for value, stand_ins in ((1024, True), (2048, False)):
        data["placeholders"] = {"V": {**PLACEHOLDERS["V"], "value": None if stand_ins else value}}
        cfg = load_experiment(write(tmp_path / "e.json", data), stand_ins=stand_ins).entries[1].config
        assert cfg["total_timesteps"] == 4 * value and cfg["eval_every"] == value // 4 and cfg["seed"] == 2
        assert cfg["modification_factory_kwargs"]["switching_thresholds"] == [value, 2 * value, 3 * value]
        assert cfg["modification_factory_kwargs"]["num_total_steps"] == 4 * value


PLACEHOLDER_BAD = [
    ({"V": {"value": 0}}, "placeholders['V'].value must be a positive integer or null, got 0"),
    ({"V": {"value": None}}, "placeholders['V'] has neither a value nor a dry_run stand-in"),
    ({"V": {"valeu": 5, "dry_run": 1024}}, "placeholders['V']: unknown key 'valeu'; did you mean 'value'"),
    ({"W": {"dry_run": 1024}}, "'4*$V' is no placeholder use ('$NAME', 'K*$NAME' or '$NAME/D' with NAME one of "
                               "placeholders: W)"),
    ({"V": {"dry_run": 1024}, "V-1": {"dry_run": 1}}, "placeholders['V-1'] must be NAME (letters, digits, _)"),
    ({"V": {"dry_run": 1026}}, "'$V/4' is not a whole number with V = 1026"),
    ({"V": {"dry_run": 1024, "amended": ["after the pilot"]}},
     "placeholders['V'].amended must be a string, got ['after the pilot']"),
]


@pytest.mark.parametrize("placeholders,message", PLACEHOLDER_BAD, ids=[str(i) for i in range(len(PLACEHOLDER_BAD))])
def test_a_malformed_placeholder_is_one_line_and_exit_2(tmp_path, capsys, placeholders, message):
    exp = write(tmp_path / "bad.json", {"placeholders": placeholders, "flags": SEQUENCE, "grid": {"seed": [1]}})
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(L.main)([exp, "--folder", str(tmp_path / "folder"), "--dry_run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["bad.json"]


def test_entry_point_refuses_with_exit_2(tmp_path):
    exp = write(tmp_path / "bad.json", {"grid": {"seed": [1]}, "flags": {**CARTPOLE, "total_timestep": 5}})
    p = subprocess.run([PY, "-m", "continual.launch", exp, "--folder", str(tmp_path / "f")], capture_output=True,
                       text=True, env=env(), cwd=REPO, timeout=300)
    assert p.returncode == 2 and p.stdout == "" and not (tmp_path / "f").exists()
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "did you mean 'total_timesteps'" in p.stderr


def test_changed_experiment_on_the_same_folder_is_refused(tmp_path, capsys):
    exp = write(tmp_path / "e.json", {"grid": {"seed": [1]}, "flags": {**CARTPOLE, "total_timesteps": 256}})
    folder = tmp_path / "f"
    q = Queue(str(folder))
    q.create()
    write(q.config_path("000_seed=1"), {**run_config(load_experiment(exp).entries[0], "e"), "total_timesteps": 512})
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(L.main)([exp, "--folder", str(folder), "--dry_run"])
    assert e.value.code == 2 and "differs from the one started" in capsys.readouterr().err


# --- the queue: claims under races -----------------------------------------------------------------------------------


def _race(folder, entries, barrier, out):
    q = Queue(folder)
    barrier.wait()
    won = [e for e in entries if q.claim(e) is not None]
    out.put((os.getpid(), won))


def _run_race(folder, entries, n=6):
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(folder, entries, barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return results


def test_claims_are_exclusive_under_a_race(tmp_path):
    q = Queue(str(tmp_path))
    q.create()
    entries = [f"{i:03d}" for i in range(40)]
    results = _run_race(str(tmp_path), entries)
    won = [e for _, w in results for e in w]
    assert sorted(won) == entries  # every entry claimed, and by exactly one process


def test_a_stale_claim_is_taken_over_by_exactly_one(tmp_path):
    q = Queue(str(tmp_path), stale_after=30)
    q.create()
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    entries = [f"{i:03d}" for i in range(20)]
    for e in entries:  # claims of a process that has exited (same host)
        write(os.path.join(q.dir, f"{e}.claim.1"), {"host": socket.gethostname(), "pid": dead.pid, "start": "1"})
    live = q.claim("live")  # a claim of this (live) process is not taken
    far = os.path.join(q.dir, "far.claim.3")  # another host's: stale only once its heartbeat is old
    write(far, {"host": "elsewhere", "pid": 1})
    results = _run_race(str(tmp_path), entries + ["live", "far"])
    won = sorted(e for _, w in results for e in w)
    assert won == entries
    assert all(q.claims(e) == [2] for e in entries)  # generation 2 replaced the stale generation 1
    assert q.still_mine(live) and q.owner("far")["host"] == "elsewhere"
    os.utime(far, (time.time() - 60, time.time() - 60))
    assert q.owner("far") is None and q.claim("far").generation == 4
    assert q.claim("far") is None  # now ours, and live


# --- the launcher with a stand-in training script --------------------------------------------------------------------

def test_local_ray_retries_from_checkpoints_reports_failures_and_skips_finished(tmp_path, capsys, ray_shutdown):
    # seed 2 fails once then succeeds (resumed); seed 3 always fails; seed 4 is refused (exit 2: no retry)
    script = fake_script(tmp_path / "s", {"2": ["fail", "ok"], "3": ["fail"], "4": ["usage"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2, 3, 4]}, "max_retries": 2})
    folder = str(tmp_path / "f")
    args = [exp, "--folder", folder, "--script", script, "--num_cpus", "2"]
    assert L.main(args) == 1
    out = capsys.readouterr().out
    q = Queue(folder)
    runs = {s: q.run_dir(f"{s - 1:03d}_seed={s}") for s in (1, 2, 3, 4)}
    assert [a[1] for a in attempts(runs[1])] == ["fresh", "end"]
    assert [a[1] for a in attempts(runs[2])] == ["fresh", "resume", "end"]  # retried from its checkpoint
    assert [a[1] for a in attempts(runs[3])] == ["fresh", "resume", "resume"]  # 1 + max_retries attempts
    assert [a[1] for a in attempts(runs[4])] == ["fresh"]
    st = {s: q.status(os.path.basename(d)) for s, d in runs.items()}
    assert [st[s]["state"] for s in (1, 2, 3, 4)] == ["done", "done", "failed", "failed"]
    assert st[3]["attempts"] == 3 and st[3]["error"] == "RuntimeError: boom" and st[4]["error"] == "error: refused"
    assert "2/4 done, 2 failed" in out and "failed: entry 2 (seed=3): RuntimeError: boom" in out
    # stdout is not a terminal here: progress comes as lines, one per change of state, not as a table at the end
    # (a run shorter than the launcher's one-second poll can go from pending to done without a "running" line)
    assert re.search(r"\d\d:\d\d:\d\d entry 0 \(seed=1\): pending", out) and "entry 0 (seed=1): done" in out
    assert "entry 2 (seed=3): failed, " in out and "━" not in out  # no table border drawn
    assert os.listdir(q.dir) == [n for n in os.listdir(q.dir) if ".claim." not in n]  # every claim released
    # again: finished and failed entries are not run again
    assert L.main(args) == 1
    assert len(attempts(runs[1])) == 2 and len(attempts(runs[3])) == 3
    # --resume-id with --retry_failed: that entry alone, with a fresh retry budget
    write(os.path.join(tmp_path, "s", "plan.json"), {"3": ["ok"]})
    assert L.main(args + ["--resume-id", "2", "--retry_failed"]) == 0
    assert [a[1] for a in attempts(runs[3])][-2:] == ["resume", "end"] and q.status("002_seed=3")["state"] == "done"
    assert q.status("003_seed=4")["state"] == "failed" and len(attempts(runs[4])) == 1
    # every run waits for CPU with OpenMP's PASSIVE policy (not spinning against the other runs), unless set
    assert {open(os.path.join(d, "omp_wait_policy")).read() for d in runs.values()} == {"PASSIVE"}


def test_entries_runs_only_the_named_entries_and_a_later_launch_the_rest(tmp_path, capsys, ray_shutdown):
    script = fake_script(tmp_path / "s", {})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2, 3, 4]}})
    folder = str(tmp_path / "f")
    args = [exp, "--folder", folder, "--script", script, "--num_cpus", "2"]
    for flags, message in ((["--entries", "1", "4", "7"], "entries: the experiment has entries 0..3, got 4, 7"),
                           (["--entries", "1", "--resume_id", "1"], "not both")):
        with pytest.raises(UserError, match=message):
            L.main(args + flags)
        assert not os.path.exists(folder)
    assert L.main(args + ["--entries", "2", "0", "2"]) == 0
    assert "2/2 done" in capsys.readouterr().out
    q = Queue(folder)
    runs = [q.run_dir(f"{s - 1:03d}_seed={s}") for s in (1, 2, 3, 4)]
    assert [os.path.exists(d) for d in runs] == [True, False, True, False]
    assert L.main(args) == 0  # the rest; the named ones are not run again
    assert "4/4 done" in capsys.readouterr().out
    assert [len(attempts(d)) for d in runs] == [2, 2, 2, 2]  # each: fresh, end


def test_entries_leaves_the_carries_of_the_others_as_they_were(tmp_path, ray_shutdown):
    """Seed 2 fails (max_retries 0) and is carried; on a new folder, --entries 0 neither restores nor re-carries it,
    and a later launch without the flag resumes it from that carry."""
    from continual.launch import carry

    script = fake_script(tmp_path / "s", {"2": ["fail", "ok"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2]}, "max_retries": 0})
    kept = str(tmp_path / "kept")

    def launch(folder, *flags):
        return L.main([exp, "--folder", str(tmp_path / folder), "--script", script, "--num_cpus", "2", "--archive",
                       kept, "--no-aggregate", *flags])
    assert launch("f") == 1
    meta = os.path.join(carry.folder_of(kept), "001_seed=2.json")
    carried = open(meta).read()
    assert launch("g", "--entries", "0", "--retry_failed") == 0
    assert open(meta).read() == carried
    run = Queue(str(tmp_path / "g")).run_dir("001_seed=2")
    assert not os.path.exists(run)
    assert launch("g", "--retry_failed") == 0
    assert [a[1] for a in attempts(run)] == ["fresh", "resume", "end"]
    assert carry.entries(kept) == []  # finished: its carry dropped


def test_the_runs_omp_wait_policy_is_passive_unless_the_launcher_has_one(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert L.omp_wait_policy() == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "")
    assert L.omp_wait_policy() == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert L.omp_wait_policy() == "ACTIVE"


def test_damaged_files_are_retried_from_the_newest_whole_checkpoint(tmp_path, ray_shutdown):
    """A full disk (exit 1) and a corrupt newest checkpoint are not bad input: retried with --resume while a whole
    checkpoint is left; an entry whose checkpoints are all damaged starts again, its remains kept aside."""
    script = fake_script(tmp_path / "s", {"1": ["storage", "ok"], "2": ["fail", "corrupt", "ok"],
                                          "3": ["corrupt", "ok"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2, 3]}, "max_retries": 2})
    folder = str(tmp_path / "f")
    assert L.main([exp, "--folder", folder, "--script", script, "--num_cpus", "2"]) == 0
    q = Queue(folder)
    runs = {s: q.run_dir(f"{s - 1:03d}_seed={s}") for s in (1, 2, 3)}
    assert [a[1] for a in attempts(runs[1])] == ["fresh", "resume", "end"]
    assert [a[1] for a in attempts(runs[2])] == ["fresh", "resume", "resume", "end"]
    # seed 3: its only checkpoint was damaged: no --resume (it would be refused, exit 2), a fresh start instead
    assert [a[1] for a in attempts(runs[3] + ".incomplete1")] == ["fresh"]
    assert [a[1] for a in attempts(runs[3])] == ["fresh", "end"]
    assert all(q.status(os.path.basename(d))["state"] == "done" for d in runs.values())


def test_restart_failed_starts_a_failed_entry_from_step_0_and_keeps_its_remains(tmp_path, ray_shutdown):
    """An entry refused at --resume (exit 2: checkpoints whole but unusable, as C-CHAIN's were on 2026-12-01) stays
    failed under --retry_failed, which resumes it again; --restart_failed starts it from step 0 once, its run directory
    kept as <entry>.incomplete1 (which the reports leave out), and a later failure of the new run is retried from the
    new run's checkpoint. The entry that did not fail is left as it was."""
    from continual.launch.queue import run_dirs

    script = fake_script(tmp_path / "s", {"1": ["fail", "usage", "usage", "fail", "ok"], "2": ["ok"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2]}, "max_retries": 2})
    folder = str(tmp_path / "f")
    base = [exp, "--folder", folder, "--script", script, "--num_cpus", "2", "--no-aggregate"]
    assert L.main(base) == 1
    q = Queue(folder)
    one, two = q.run_dir("000_seed=1"), q.run_dir("001_seed=2")
    assert q.status("000_seed=1")["state"] == "failed" and q.status("001_seed=2")["state"] == "done"
    assert L.main(base + ["--retry_failed"]) == 1  # resumed, refused again
    assert [a[1] for a in attempts(one)] == ["fresh", "resume", "resume"]
    assert L.main(base + ["--restart_failed"]) == 0
    assert [a[1] for a in attempts(one + ".incomplete1")] == ["fresh", "resume", "resume"]
    assert [a[1] for a in attempts(one)] == ["fresh", "resume", "end"]  # from step 0; its failure resumed
    assert [a[1] for a in attempts(two)] == ["fresh", "end"]
    assert q.status("000_seed=1")["state"] == "done"
    assert run_dirs(folder) == [one, two]


@pytest.fixture
def cluster():
    """A Ray cluster on this machine (ray.cluster_utils: a head node of 2 CPUs; tests add nodes), shut down after."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                     "object_store_memory": 100 * 1024 * 1024})
    yield c
    c.shutdown()


def test_two_launchers_on_one_folder_split_the_work(tmp_path, cluster):
    # every run waits for `go`: the first launcher holds 2 entries (2 CPUs) when the second one starts
    script = fake_script(tmp_path / "s", {str(s): ["wait"] for s in range(1, 7)})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": list(range(1, 7))}})
    folder = str(tmp_path / "f")
    cmd = [PY, "-m", "continual.launch", exp, "--folder", folder, "--script", script, "--address",
           cluster.address, "--no-aggregate"]
    logs = [open(tmp_path / f"l{i}.txt", "w") for i in range(2)]
    a = subprocess.Popen(cmd, stdout=logs[0], stderr=subprocess.STDOUT, env=env(), cwd=REPO)
    q = Queue(folder)
    deadline = time.time() + 240
    while len(glob.glob(os.path.join(q.dir, "*.claim.*"))) < 2 and time.time() < deadline:
        time.sleep(0.2)
    b = subprocess.Popen(cmd, stdout=logs[1], stderr=subprocess.STDOUT, env=env(), cwd=REPO)
    while len(glob.glob(os.path.join(q.dir, "*.claim.*"))) < 4 and time.time() < deadline:
        time.sleep(0.2)
    (tmp_path / "s" / "go").write_text("")
    assert a.wait(timeout=300) == 0 and b.wait(timeout=300) == 0
    by = {}
    for s in range(1, 7):
        name = f"{s - 1:03d}_seed={s}"
        assert [x[1] for x in attempts(q.run_dir(name))] == ["fresh", "end"]  # run once, by one launcher
        st = q.status(name)
        assert st["state"] == "done"
        by.setdefault(st["pid"], []).append(name)
    assert set(by) == {a.pid, b.pid}, by  # both launchers ran entries


# --- real training runs (slow) ---------------------------------------------------------------------------------------


def launches(log_path) -> list[str]:
    with open(log_path) as f:
        return [ln for ln in f if ln.startswith("=== launch:") and " pid " in ln]


def intervals(run_dir) -> tuple[float, float]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        times = [json.loads(ln)["time"] for ln in f if ln.strip()]
    return min(times), max(times)


@pytest.mark.slow
def test_a_2x2_grid_runs_concurrently_on_local_ray_and_is_aggregated(tmp_path, ray_shutdown):
    exp = write(tmp_path / "e.json", {"flags": {**CARTPOLE, "total_timesteps": 2048, "eval_every": 1024,
                                                "eval_episodes": 2},
                                      "grid": {"architecture": ["PPO", "PPO_CBP"], "seed": [1, 2]}})
    folder = tmp_path / "f"
    assert L.main([exp, "--folder", str(folder), "--num_cpus", "2"]) == 0
    q = Queue(str(folder))
    dirs = [q.run_dir(e.name) for e in load_experiment(exp).entries]
    assert all(q.status(os.path.basename(d))["state"] == "done" for d in dirs)
    spans = sorted(intervals(d) for d in dirs)
    assert any(a[1] > b[0] for a, b in zip(spans, spans[1:])), spans  # two runs trained at the same time
    agg = json.load(open(folder / "aggregate.json"))
    # grouped by exp_name, whose default is the architecture in lower case (CleanRL's: the script's name)
    assert set(agg["groups"]) == {"ppo", "ppo_cbp"} and agg["groups"]["ppo"]["summary"]["final"]["n"] == 2
    assert set(agg["robust"]["keys"]["final"]["methods"]) == {"ppo", "ppo_cbp"}
    assert (folder / "plots" / "robust.png").stat().st_size > 10_000 and (folder / "plots" / "comparison.png").exists()
    for d in dirs:
        assert json.load(open(os.path.join(d, "config.json")))["wandb_group"] == "e"


@pytest.mark.slow
def test_a_killed_launcher_rerun_finishes_without_redoing_finished_runs(tmp_path):
    exp = write(tmp_path / "e.json", {"flags": {**CARTPOLE, "total_timesteps": 6144, "checkpoint_every": 512},
                                      "grid": {"seed": [1, 2, 3]}})
    folder = str(tmp_path / "f")
    cmd = [PY, "-m", "continual.launch", exp, "--folder", folder, "--num_cpus", "2"]
    q = Queue(folder)
    names = [e.name for e in load_experiment(exp).entries]
    a = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=REPO)
    deadline = time.time() + 500
    # kill it once one entry is done and another has a periodic checkpoint but is not finished
    while time.time() < deadline:
        states = [q.status(n).get("state") for n in names]
        ckpts = [n for n in names if q.status(n).get("state") != "done" and
                 glob.glob(os.path.join(q.run_dir(n), "checkpoints", "periodic__*"))]
        if "done" in states and ckpts:
            break
        time.sleep(0.5)
    a.kill()
    a.wait()
    done_before = [n for n in names if q.status(n).get("state") == "done"]
    had_checkpoint = [n for n in names if n not in done_before and
                      glob.glob(os.path.join(q.run_dir(n), "checkpoints", "*.cleanrl_model"))]
    assert done_before and had_checkpoint
    time.sleep(2)
    b = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=REPO, timeout=600)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    for n in names:
        assert q.status(n)["state"] == "done"
        if n in done_before:
            assert len(launches(q.log_path(n))) == 1  # not redone
        elif n in had_checkpoint:
            assert "--resume" in launches(q.log_path(n))[-1]  # resumed from its newest checkpoint
        # (an entry started but killed before its first checkpoint starts afresh; its remains are kept aside)
    steps = [json.loads(ln)["global_step"] for ln in open(os.path.join(q.run_dir(had_checkpoint[0]), "metrics.jsonl"))
             if '"iteration"' in ln]
    assert steps == sorted(set(steps)) and steps[-1] == 6144  # one continuous run, no step twice


@pytest.mark.slow
def test_a_two_node_cluster_places_runs_on_both_and_resumes_a_lost_nodes_runs(tmp_path):
    """Two Ray nodes on this machine (ray.cluster_utils), one CPU each; the second is killed while both run: its
    run is resumed on the head from its checkpoint."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                           "object_store_memory": 100 * 1024 * 1024})
    try:
        _two_nodes(tmp_path, cluster)
    finally:
        cluster.shutdown()


def _two_nodes(tmp_path, cluster):
    head = cluster.head_node
    other = cluster.add_node(num_cpus=1, object_store_memory=100 * 1024 * 1024)
    exp = write(tmp_path / "e.json", {"flags": {**CARTPOLE, "total_timesteps": 8192, "checkpoint_every": 512},
                                      "grid": {"seed": [1, 2]}})
    folder = str(tmp_path / "f")
    q = Queue(folder)
    names = [e.name for e in load_experiment(exp).entries]
    a = subprocess.Popen([PY, "-m", "continual.launch", exp, "--folder", folder, "--address", cluster.address],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=REPO)
    node_ids = {head.node_id[:12]: "head", other.node_id[:12]: "other"}
    deadline = time.time() + 500
    placed = {}
    while time.time() < deadline and len(placed) < 2:
        for n in names:
            for ln in launches(q.log_path(n)) if os.path.exists(q.log_path(n)) else []:
                placed[n] = node_ids[re.search(r" node (\w+) ", ln).group(1)]
        time.sleep(0.3)
    assert sorted(placed.values()) == ["head", "other"]  # one run on each node
    victim = next(n for n, where in placed.items() if where == "other")
    while time.time() < deadline and not glob.glob(os.path.join(q.run_dir(victim), "checkpoints", "periodic__*")):
        time.sleep(0.3)
    cluster.remove_node(other, allow_graceful=False)
    assert a.wait(timeout=600) == 0
    assert all(q.status(n)["state"] == "done" for n in names)
    last = launches(q.log_path(victim))[-1]
    assert "--resume" in last and node_ids[re.search(r" node (\w+) ", last).group(1)] == "head"


@pytest.mark.slow
def test_sigterm_stops_the_runs_releases_claims_and_a_rerun_resumes(tmp_path):
    script = fake_script(tmp_path / "s", {"1": ["wait", "ok"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1]}})
    folder = str(tmp_path / "f")
    cmd = [PY, "-m", "continual.launch", exp, "--folder", folder, "--script", script, "--num_cpus", "1"]
    q = Queue(folder)
    run_dir = q.run_dir("000_seed=1")
    a = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=REPO)
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(run_dir, "attempts")) and time.time() < deadline:
        time.sleep(0.2)
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=300) == 130
    assert q.status("000_seed=1")["state"] == "interrupted" and q.claims("000_seed=1") == []
    assert "stopped by the launcher" in open(q.log_path("000_seed=1")).read()
    assert subprocess.run(cmd, capture_output=True, env=env(), cwd=REPO, timeout=300).returncode == 0
    assert [x[1] for x in attempts(run_dir)] == ["fresh", "resume", "end"]


# --- seeds_per_process: an arm's DQN seeds in one process ------------------------------------------------------------

# two MinAtar games, C-CHAIN's protocol in small (random steps per task, an update per step, Double DQN, fused Adam)
MINATAR_DQN = {"architecture": "DQN", "backend": "MinAtar", "env_id": "MinAtar/SpaceInvaders", "num_envs": 1,
               "num_steps": 100, "reward_scaling": "none", "buffer_size": 1000, "learning_starts": 100,
               "learning_starts_each_regime": True, "train_frequency": 1, "target_network_frequency": 100,
               "exploration_fraction": 0.25, "double_dqn": True, "fused_adam": True, "torch_threads": 1,
               "eval_every": 200, "eval_episodes": 1, "eval_greedy": True, "checkpoint_every": 100,
               "checkpoint_minutes": 0, "keep_checkpoints": 5, "modification_factory": "TaskSequence",
               "modification_factory_kwargs": {"cycles": 1, "tasks": [{"env_id": "MinAtar/SpaceInvaders", "steps": 200},
                                                                       {"env_id": "MinAtar/Asterix", "steps": 200}]}}


def _kill_group(config: str, runs: list, done, min_step: int = 0) -> None:
    """SIGKILL the agents/dqn_seeds.py process started with `config` once each of `runs` has a whole periodic
    checkpoint at `min_step` or later (the process is this test's: its command line names the test's folder)."""
    from continual.training.checkpoint import looks_complete

    def whole(run: str) -> bool:
        return any(looks_complete(f) for f in glob.glob(os.path.join(run, "checkpoints", "periodic__*"))
                   if step_of(f) >= min_step)
    while not done.is_set():
        if all(map(whole, runs)):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().decode(errors="replace").split("\0")
                except OSError:
                    continue
                if any(a.endswith("dqn_seeds.py") for a in argv) and config in argv:
                    os.kill(int(pid), signal.SIGKILL)
                    return
        time.sleep(0.05)


@pytest.mark.long  # ~75 s at load 6 (Ray, 4 grouped and 2 resumed DQN runs): handed out first
def test_seeds_per_process_runs_an_arms_seeds_in_one_process_as_their_entries_alone(tmp_path, ray_shutdown):
    """seeds_per_process 2 on 2 seeds x 2 DQN arms (MinAtar, a switch): each arm's seeds run in one agents/dqn_seeds.py
    process, each seed's run directory bit for bit what its entry's own job writes (the training script on the
    entry's config, here in-process); the C-CHAIN group is killed after its first checkpoints: each of its seeds is
    retried alone, resumed from its own checkpoint; the archive and the aggregate read the runs."""
    import threading

    import continual_training_example
    from continual.evaluation import metrics
    from continual.io import read_jsonl
    from continual.launch import archive
    from continual.machine import LAUNCHES, machine
    from helpers.run_records import assert_same_run, records

    exp = write(tmp_path / "e.json", {"flags": MINATAR_DQN, "seeds_per_process": 2, "grid": {"seed": [1, 2], "flags": [
        {"name": "vanilla"}, {"name": "c_chain", "c_chain": True}]}})
    folder, kept = str(tmp_path / "f"), str(tmp_path / "kept")
    q = Queue(folder)
    names = [e.name for e in load_experiment(exp).entries]
    vanilla, c_chain = names[0::2], names[1::2]  # seed 1's entries, then seed 2's
    done = threading.Event()
    killer = threading.Thread(target=_kill_group, args=(q.config_path(c_chain[0]), [q.run_dir(n) for n in c_chain],
                                                        done))
    killer.start()
    try:
        assert L.main([exp, "--folder", folder, "--num_cpus", "2", "--archive", kept, "--no-aggregate"]) == 0
    finally:
        done.set()
        killer.join()
    for group in (vanilla, c_chain):
        assert f"dqn_seeds.py --seeds 1 2 --run_names {' '.join(group)} " in launches(q.log_path(group[0]))[0]
        assert "with 2 seeds in one process" in open(q.log_path(group[1])).read()
    assert all(q.status(n)["state"] == "done" for n in names)
    for n in vanilla:
        alone = continual_training_example.main(["--config", q.config_path(n), "--runs_dir", str(tmp_path / "alone"),
                                                 "--run_name", n])
        assert sum(r["kind"] == "switch" for r in assert_same_run(q.run_dir(n), alone, differ=("runs_dir",))) == 1
    for n in c_chain:  # killed with its group, then alone from its own checkpoint
        last = launches(q.log_path(n))[-1]
        assert q.status(n)["attempts"] == 1 and f"--resume {q.run_dir(n)}" in last and "dqn_seeds" not in last
        steps = [r["global_step"] for r in records(q.run_dir(n)) if r["kind"] == "iteration"]
        assert steps == sorted(set(steps)) and steps[-1] == 400  # one continuous run, no step twice
    assert archive.verify_manifest(kept) == [] and sorted(os.listdir(os.path.join(kept, "runs"))) == names
    here = machine()
    for n in names:  # each launch of a run (the group's, the lone resume) recorded before the run's own start record
        launched = read_jsonl(os.path.join(q.run_dir(n), LAUNCHES))
        starts = [r for r in read_jsonl(os.path.join(q.run_dir(n), "metrics.jsonl")) if r["kind"] == "start"]
        assert len(launched) == len(starts) == (2 if n in c_chain else 1), n
        assert all(r["machine"] == here for r in launched + starts)
        assert all(launched[i]["time"] <= s["time"] < (launched[i + 1]["time"] if i + 1 < len(launched) else math.inf)
                   for i, s in enumerate(starts)), n
        assert read_jsonl(os.path.join(kept, "runs", n, LAUNCHES)) == launched  # archived with the run
    agg = metrics.main([*(os.path.join(kept, "runs", n) for n in names), "--group_by", "c_chain", "--out",
                        str(tmp_path / "aggregate.json")])
    assert {k: g["summary"]["final"]["n"] for k, g in agg["groups"].items()} == {"c_chain=False": 2, "c_chain=True": 2}


@pytest.mark.long  # ~60 s at load 4 (Ray, 4 grouped runs killed, 1 group and 2 single resumes)
def test_a_later_launch_resumes_an_arms_seeds_together_when_their_checkpoints_are_at_one_step(tmp_path, ray_shutdown):
    """Both groups killed (a session's end takes the launcher too; here --max_retries 0 reports them failed, and
    --retry_failed launches again): the arm whose seeds' newest checkpoints are at one step resumes in one
    agents/dqn_seeds.py --resume process, the arm whose second seed is a checkpoint behind resumes each seed alone;
    every run ends one continuous run, no step logged twice."""
    import threading

    from continual.training.checkpoint import checkpoints_newest_first, newest_whole_step
    from helpers.run_records import records

    exp = write(tmp_path / "e.json", {"flags": MINATAR_DQN, "seeds_per_process": 2, "max_retries": 0,
                                      "grid": {"seed": [1, 2], "flags": [{"name": "vanilla"},
                                                                         {"name": "c_chain", "c_chain": True}]}})
    folder = str(tmp_path / "f")
    q = Queue(folder)
    names = [e.name for e in load_experiment(exp).entries]
    together, apart = names[0::2], names[1::2]
    done = threading.Event()
    killers = [threading.Thread(target=_kill_group, args=(q.config_path(arm[0]), [q.run_dir(n) for n in arm], done,
                                                          200)) for arm in (together, apart)]
    for k in killers:
        k.start()
    try:
        assert L.main([exp, "--folder", folder, "--num_cpus", "2", "--no-aggregate"]) == 1
    finally:
        done.set()
        for k in killers:
            k.join()
    assert all(q.status(n)["state"] == FAILED for n in names)

    def keep_upto(run: str, step: int) -> None:  # what a kill before the checkpoints after `step` leaves
        for f in checkpoints_newest_first(run):
            if step_of(f) > step:
                os.unlink(f)
    for arm, behind in ((together, 0), (apart, 100)):
        step = min(newest_whole_step(q.run_dir(n)) for n in arm)
        assert step is not None and step >= 200
        keep_upto(q.run_dir(arm[0]), step)
        keep_upto(q.run_dir(arm[1]), step - behind)
    assert L.main([exp, "--folder", folder, "--num_cpus", "2", "--retry_failed", "--no-aggregate"]) == 0
    assert f"dqn_seeds.py --resume {q.run_dir(together[0])} {q.run_dir(together[1])}" in \
        launches(q.log_path(together[0]))[-1]
    for n in apart:
        last = launches(q.log_path(n))[-1]
        assert f"--resume {q.run_dir(n)}" in last and "dqn_seeds" not in last
    for n in names:
        assert q.status(n)["state"] == "done"
        steps = [r["global_step"] for r in records(q.run_dir(n)) if r["kind"] == "iteration"]
        assert steps == list(range(100, 401, 100)), n  # one continuous run, no step twice


@pytest.mark.long  # ~21 s (Ray, 3 DQN runs of 400 steps)
def test_entries_of_one_arm_fill_the_free_slots_in_smaller_groups(tmp_path, ray_shutdown):
    """--entries naming one arm's 3 seeds (seeds_per_process 3) on 2 slots: a group of 2 and a run alone, so both
    cores work on the named seeds; the other arm's entries are left as they were."""
    exp = write(tmp_path / "e.json", {"flags": MINATAR_DQN, "seeds_per_process": 3, "grid": {"seed": [1, 2, 3], "flags": [
        {"name": "vanilla"}, {"name": "c_chain", "c_chain": True}]}})
    folder = str(tmp_path / "f")
    q = Queue(folder)
    names = [e.name for e in load_experiment(exp).entries]
    vanilla, c_chain = names[0::2], names[1::2]
    assert L.main([exp, "--folder", folder, "--num_cpus", "2", "--no-aggregate", "--entries", "0", "2", "4"]) == 0
    assert f"dqn_seeds.py --seeds 1 2 --run_names {vanilla[0]} {vanilla[1]} " in launches(q.log_path(vanilla[0]))[0]
    assert "dqn_seeds" not in launches(q.log_path(vanilla[2]))[0]
    assert all(q.status(n)["state"] == "done" for n in vanilla)
    assert not any(os.path.exists(q.run_dir(n)) or q.status(n).get("state") == "done" for n in c_chain)


def test_seeds_per_process_needs_agents_dqn_seeds_beside_the_script(tmp_path, capsys):
    script = fake_script(tmp_path / "s", {})
    exp = write(tmp_path / "e.json", {"flags": {**CARTPOLE, "architecture": "DQN"}, "grid": {"seed": [1, 2]},
                                      "seeds_per_process": 2})
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(L.main)([exp, "--folder", str(tmp_path / "f"), "--script", script])
    assert e.value.code == 2 and "seeds_per_process: no " in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "configs", "experiments", "*.json"))), ids=os.path.basename)
def test_shipped_experiment_files_validate(path, tmp_path):
    """Every experiment under configs/experiments/ expands, and one entry per seed-free variant passes the training
    CLI's own checks (the launcher checks all of them before it starts)."""
    import dataclasses

    from continual.launch.experiment import load_experiment, validate

    experiment = load_experiment(path, stand_ins=True)  # a budget a pilot sets: its dry-run stand-in
    assert experiment.entries
    first_seed = experiment.entries[0].config.get("seed")
    variants = [e for e in experiment.entries if e.config.get("seed") == first_seed][:4]
    validate(dataclasses.replace(experiment, entries=variants), str(tmp_path / "runs"))


def test_a_full_disk_writing_a_status_file_is_one_line_and_keeps_the_old_status(tmp_path, monkeypatch):
    import errno

    from continual.errors import StorageError

    q = Queue(str(tmp_path))
    q.create()
    q.set_status("e", state="running")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    with pytest.raises(StorageError, match=r"^no space left on device writing .*e\.status\.json; free space and run"):
        q.set_status("e", state="done")
    monkeypatch.undo()
    assert q.status("e")["state"] == "running" and os.listdir(q.dir) == ["e.status.json"]


def test_line_progress_and_the_table_at_80_columns(tmp_path):
    """Without a terminal the launcher prints a line per change of state and, every `every` seconds, the running
    entries and a count; the table folds labels at 80 columns instead of cutting them to the same prefix."""
    import io

    from rich.console import Console

    exp = load_experiment(write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {
        "architecture": ["PPO", "PPO_CBP"], "seed": [1]}}))
    q = Queue(str(tmp_path / "f"))
    q.create()
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=False)
    launcher = L.Launcher(exp, exp.entries, q, "x.py", 0, False, console, None)
    progress = L.LineProgress(launcher, console, every=3600)
    progress.update()
    q.set_status(exp.entries[0].name, state="done", returncode=0, where="vm:1", error="")
    progress.update()
    progress.update()  # nothing changed: no line
    lines = buf.getvalue().splitlines()
    assert [re.sub(r"^\d\d:\d\d:\d\d ", "", x) for x in lines] == [
        "entry 0 (architecture=PPO, seed=1): pending", "entry 1 (architecture=PPO_CBP, seed=1): pending",
        "entry 0 (architecture=PPO, seed=1): done, vm:1"]
    progress.every, progress.last = 0.0, 0.0
    progress.update()
    assert buf.getvalue().splitlines()[-1].endswith("1/2 done, 0 running, 0 failed")
    table = io.StringIO()
    Console(file=table, width=80).print(launcher.table())
    text = table.getvalue()
    assert "PPO_CBP" in text and "…" not in text  # folded onto a second line, not cut


def test_the_progress_line_tells_the_hours_left_at_the_recent_rate(tmp_path):
    """A run at step 440,000 of 6M at 114 steps/s has (6e6 - 440e3) / 114 / 3600 = 13.5 h left. The rate is read
    from the iterations' times since the run's last start (a pause before it, or the start-up, lowers the SPS it
    logs, which counts from the start: 50 here), a pause of 20 minutes among them left out; with one iteration only,
    that SPS; nothing is told for a run without a rate, a total or steps left."""
    run = tmp_path / "r"
    run.mkdir()
    write(run / "config.json", {"resolved_total_timesteps": 6_000_000})
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"kind": "iteration", "global_step": 1000, "time": 0.0, "charts/SPS": 7}) + "\n")
        f.write(json.dumps({"kind": "start", "global_step": 2000, "time": 10.0}) + "\n")
        for i in range(5):
            f.write(json.dumps({"kind": "iteration", "global_step": 440_000 - 4 * 11_400 + i * 11_400,
                                "time": 1000.0 + 100 * i + (1200 if i >= 3 else 0), "charts/SPS": 50}) + "\n")
            f.write(json.dumps({"kind": "episode", "global_step": 1, "return": 3.0}) + "\n")
    assert "rate" not in L.read_progress(str(run))  # the table's read, every second, stops at what it shows
    p = L.read_progress(str(run), rate=True)
    assert p["step"] == 440_000 and p["rate"] == pytest.approx(114) and p["return"] == 3.0
    assert L.time_left(p) == ", ~13.5 h left"
    assert L.time_left({"step": 440_000, "total": 6_000_000, "sps": 114}) == ", ~13.5 h left"
    for p in ({"step": 5, "total": 10, "sps": 0}, {"step": 10, "total": 10, "sps": 3}, {"step": 5, "sps": 3}, {}):
        assert L.time_left(p) == ""


@pytest.mark.slow
def test_the_freeway_continual_experiment_runs_a_short_sequence_through_the_launcher(tmp_path):
    """hackatari_freeway_continual.json with its budget set to 512 steps a visit (a 2,048-step pixel Freeway sequence:
    unmodified -> all_white_cars -> vary_car_speeds -> unmodified) and small rollouts and evaluations, seed 3 of its
    three methods: every run finishes, evaluates every regime before every switch, and the forgetting report reads
    the folder with the file's declarations. Measured on the 2-core machine under a load of 12-17 from other
    sessions (the runs at nice 15): ~12 minutes a run; on a free machine it is minutes in all."""
    shipped = os.path.join(REPO, "configs", "experiments", "hackatari_freeway_continual.json")
    with open(shipped) as f:
        data = json.load(f)
    data["placeholders"]["BUDGET"]["value"] = 512
    data["tuning"]["experiment"] = os.path.join(REPO, "configs", "experiments", data["tuning"]["experiment"])
    data["flags"].update({"num_envs": 2, "num_steps": 64, "eval_every": "$BUDGET/4", "eval_episodes": 1,
                          "eval_num_envs": 1, "eval_max_episode_steps": 64})
    data["grid"]["seed"] = [3]
    exp = write(tmp_path / "freeway.json", data)
    folder = str(tmp_path / "f")
    p = subprocess.run([PY, "-m", "continual.launch", exp, "--folder", folder, "--num_cpus", "2", "--no-aggregate"],
                       capture_output=True, text=True, env=env(), cwd=REPO, timeout=3600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    q = Queue(folder)
    entries = load_experiment(exp).entries
    assert [e.config["exp_name"] for e in entries] == ["PPO", "PPO_CBP", "PPO+S&P"]
    for e in entries:
        assert q.status(e.name)["state"] == "done"
        with open(os.path.join(q.run_dir(e.name), "eval_table.csv")) as f:
            rows = list(csv.DictReader(f))
        steps = {int(r["step"]) for r in rows}
        assert {0, 512, 1024, 1536, 2048} <= steps  # the switches and the end
        assert {r["modification"] for r in rows} == {"", "all_white_cars", "vary_car_speeds"}
    from continual.report import forgetting

    res = forgetting.report(folder)
    for label in ("PPO", "PPO_CBP", "PPO+S&P"):
        assert res["per_method"][label]["primary_task"] == "" and res["per_method"][label]["primary"][0] is not None
        assert [(w["from"], w["into"]) for w in res["per_method"][label]["switches"]] == [
            ("", "all_white_cars"), ("all_white_cars", "vary_car_speeds"), ("vary_car_speeds", "")]


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="Linux without scheduling autogroups")
def test_a_run_in_its_own_session_keeps_the_launchers_nice_for_its_autogroup():
    """A training gets its own session (so the launcher can signal its whole process group), which on Linux is a new
    autogroup; `nice` on the launcher must still make the runs yield the CPU."""
    code = ("import os, subprocess, sys\n"
            "from continual.launch.ray_runner import _die_with_parent\n"
            "child = 'import os; print(os.getsid(0), os.nice(0), open(\"/proc/self/autogroup\").read().strip())'\n"
            "for more in (0, 7):\n"
            "    os.nice(more)\n"
            "    out = subprocess.run([sys.executable, '-c', child], preexec_fn=_die_with_parent, capture_output=True,\n"
            "                         text=True, check=True).stdout.split()\n"
            "    print(os.getsid(0), out[0], out[1], out[-1])\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    (sid, child_sid, nice, group), (_, child_sid_later, nicer, group_later) = [line.split() for line in lines]
    assert child_sid != sid and child_sid_later != sid  # a session (and an autogroup) of its own
    assert group == nice  # 0 (left alone) or the nice the tests run at
    assert int(nicer) == min(int(nice) + 7, 19) and group_later == nicer
