"""continual.launch.archive: finished runs kept without their checkpoints, restored by a launch into an empty folder
(the scratch disk lost between sessions), entries written whole or not at all, and the launcher's --archive."""

from __future__ import annotations

import filecmp
import gzip
import json
import os
import shutil

import pytest
from test_launch import CARTPOLE, attempts, fake_script, write

from continual.errors import UserError
from continual.io import read_jsonl
from continual.launch import archive as A
from continual.launch import launcher as L
from continual.launch.queue import Queue

pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture
def ray_shutdown():
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def finished_folder(tmp_path, seeds=(1, 2), states=None) -> Queue:
    """An experiment folder as the launcher leaves it: a run directory with checkpoints, TensorBoard events, a W&B
    folder and metrics per entry, and each entry's status."""
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": list(seeds)}})
    q = Queue(str(tmp_path / "f"))
    q.create()
    shutil.copy(exp, os.path.join(q.folder, "experiment.json"))
    for i, s in enumerate(seeds):
        name = f"{i:03d}_seed={s}"
        run = q.run_dir(name)
        for sub in ("checkpoints", "wandb/offline-run", "plots", "replay"):
            os.makedirs(os.path.join(run, sub))
        open(os.path.join(run, "replay", "obs.npy"), "wb").write(b"r")  # CLEAR's buffer: resume state
        write(os.path.join(run, "config.json"), {"seed": s})
        open(os.path.join(run, "checkpoints", "final.cleanrl_model"), "wb").write(b"x" * 1000)
        open(os.path.join(run, "events.out.tfevents.1.host.1.0"), "wb").write(b"tb")
        open(os.path.join(run, "wandb", "offline-run", "run.wandb"), "wb").write(b"w")
        open(os.path.join(run, "plots", "curve.png"), "wb").write(b"png")
        open(os.path.join(run, "eval_table.csv"), "w").write("step,modification,mean\n0,,1.0\n")
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            for step in range(0, 500, 10):
                f.write(json.dumps({"kind": "episode", "global_step": step, "return": step / 7}) + "\n")
        write(q.config_path(name), {"seed": s})
        q.set_status(name, state=(states or {}).get(s, "done"), returncode=0)
    return q


def test_a_finished_run_is_kept_without_checkpoints_and_reads_back_the_same(tmp_path, monkeypatch):
    q = finished_folder(tmp_path, seeds=(1, 2, 3), states={2: "failed", 3: "running"})
    monkeypatch.setattr(A, "MAX_FILE_BYTES", 100)
    open(os.path.join(q.run_dir("000_seed=1"), "plots", "big.png"), "wb").write(b"p" * 101)  # over the limit
    kept = Queue(str(tmp_path / "kept"))
    assert A.main([q.folder, kept.folder]) == 0
    run, copy = q.run_dir("000_seed=1"), kept.run_dir("000_seed=1")
    assert sorted(os.listdir(kept.folder + "/runs")) == ["000_seed=1"]  # failed and running entries are not kept
    assert sorted(os.listdir(copy)) == ["archive_left_out.json", "config.json", "eval_table.csv", "metrics.jsonl.gz",
                                        "plots"]
    assert os.listdir(os.path.join(copy, "plots")) == ["curve.png"]
    assert json.load(open(os.path.join(copy, "archive_left_out.json"))) == [{"file": "plots/big.png", "bytes": 101}]
    assert read_jsonl(os.path.join(copy, "metrics.jsonl")) == read_jsonl(os.path.join(run, "metrics.jsonl"))
    assert gzip.open(os.path.join(copy, "metrics.jsonl.gz")).read() == open(os.path.join(run, "metrics.jsonl"), "rb").read()
    assert kept.status("000_seed=1") == q.status("000_seed=1")
    assert filecmp.cmp(q.config_path("000_seed=1"), kept.config_path("000_seed=1"), shallow=False)
    # the same bytes again (gzip without a time stamp): nothing for git to see; an unchanged entry is not rewritten
    before = open(os.path.join(copy, "metrics.jsonl.gz"), "rb").read()
    shutil.rmtree(copy)
    os.unlink(os.path.join(kept.dir, "000_seed=1.status.json"))
    assert A.archive_entry(q, kept, "000_seed=1") is True
    assert open(os.path.join(copy, "metrics.jsonl.gz"), "rb").read() == before
    assert A.archive_entry(q, kept, "000_seed=1") is False


def test_an_archive_killed_at_any_write_leaves_the_entry_whole_or_absent(tmp_path, monkeypatch):
    q = finished_folder(tmp_path, seeds=(1,))
    kept, entry = Queue(str(tmp_path / "kept")), "000_seed=1"
    calls = []
    real_replace = os.replace

    def count(*a):
        calls.append(a)
        return real_replace(*a)

    monkeypatch.setattr(A.os, "replace", count)
    A.archive_entry(q, kept, entry)
    monkeypatch.setattr(A.os, "replace", real_replace)
    n = len(calls)
    assert n == 2  # the run directory, then its status
    for k in range(n):  # killed before the k-th rename
        shutil.rmtree(kept.folder, ignore_errors=True)
        done = []

        def die(*a, k=k):
            if len(done) == k:
                raise KeyboardInterrupt
            done.append(a)
            return real_replace(*a)

        monkeypatch.setattr(A.os, "replace", die)
        with pytest.raises(KeyboardInterrupt):
            A.archive_entry(q, kept, entry)
        monkeypatch.setattr(A.os, "replace", real_replace)
        assert not A.archived(kept, entry)
        target = Queue(str(tmp_path / f"restore{k}"))
        target.create()
        assert A.restore_entry(kept, target, entry) is False and not os.path.exists(target.run_dir(entry))
        assert A.archive_entry(q, kept, entry) is True  # the next launch finishes the job
        assert A.archived(kept, entry) and sorted(os.listdir(os.path.dirname(kept.run_dir(entry)))) == [entry]


def test_restore_fills_an_empty_folder_and_never_replaces_a_run_there(tmp_path):
    q = finished_folder(tmp_path, seeds=(1, 2))
    kept = Queue(str(tmp_path / "kept"))
    A.main([q.folder, kept.folder])
    fresh = Queue(str(tmp_path / "fresh"))
    fresh.create()
    os.makedirs(fresh.run_dir("001_seed=2"))  # a newer run of entry 1, unfinished: it stays
    assert [A.restore_entry(kept, fresh, e) for e in ("000_seed=1", "001_seed=2")] == [True, False]
    assert fresh.status("000_seed=1")["state"] == "done" and fresh.status("001_seed=2") == {}
    assert os.listdir(fresh.run_dir("001_seed=2")) == []
    assert read_jsonl(os.path.join(fresh.run_dir("000_seed=1"), "metrics.jsonl")) == \
        read_jsonl(os.path.join(q.run_dir("000_seed=1"), "metrics.jsonl"))


def test_an_archive_of_another_experiment_or_a_missing_folder_is_exit_2_creating_nothing(tmp_path, capsys):
    q = finished_folder(tmp_path, seeds=(1,))
    kept = str(tmp_path / "kept")
    A.main([q.folder, kept])
    other = write(tmp_path / "other.json", {"flags": CARTPOLE, "grid": {"seed": [7]}})
    with pytest.raises(UserError, match="holds another experiment"):
        A.check_archive(kept, other)
    with pytest.raises(UserError, match="holds another experiment"):
        L.main([other, "--folder", str(tmp_path / "new"), "--archive", kept])
    assert not os.path.exists(tmp_path / "new")
    with pytest.raises(UserError, match="not an experiment folder"):
        A.main([str(tmp_path / "nothing"), str(tmp_path / "kept2")])
    assert not os.path.exists(tmp_path / "kept2")


def test_the_launcher_archives_each_finished_run_and_a_new_folder_runs_only_the_rest(tmp_path, capsys, ray_shutdown):
    """Session 1 finishes seeds 1-2 (seed 3 fails); its scratch folder is lost; session 2, with a new folder and the
    same archive, runs seed 3 alone."""
    script = fake_script(tmp_path / "s", {"3": ["fail"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2, 3]}, "max_retries": 0})
    kept = Queue(str(tmp_path / "kept"))
    first = str(tmp_path / "scratch1")
    assert L.main([exp, "--folder", first, "--script", script, "--num_cpus", "2", "--archive", kept.folder]) == 1
    assert sorted(os.listdir(os.path.join(kept.folder, "runs"))) == ["000_seed=1", "001_seed=2"]
    assert "checkpoints" not in os.listdir(kept.run_dir("000_seed=1"))
    shutil.rmtree(first)
    write(os.path.join(tmp_path, "s", "plan.json"), {})
    second = Queue(str(tmp_path / "scratch2"))
    capsys.readouterr()
    assert L.main([exp, "--folder", second.folder, "--script", script, "--num_cpus", "2", "--archive", kept.folder]) == 0
    assert "2 finished entries restored" in capsys.readouterr().out
    assert [a[1] for a in attempts(second.run_dir("000_seed=1"))] == ["fresh", "end"]  # not run again
    assert [a[1] for a in attempts(second.run_dir("002_seed=3"))] == ["fresh", "end"]
    assert sorted(os.listdir(os.path.join(kept.folder, "runs"))) == ["000_seed=1", "001_seed=2", "002_seed=3"]
    assert all(kept.status(f"{i:03d}_seed={i + 1}")["state"] == "done" for i in range(3))
