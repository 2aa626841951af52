"""continual.launch.archive: finished runs kept without their checkpoints, restored by a launch into an empty folder
(the scratch disk lost between sessions), entries written whole or not at all, the launcher's --archive, and the
archive's manifest (every file's sha256 and size): an edited, missing or extra file anywhere is found, and refused in
one line with exit 2."""

from __future__ import annotations

import filecmp
import gzip
import json
import os
import shutil
import subprocess

import pytest

from continual.errors import UserError, exit_on_user_error
from continual.io import read_jsonl
from continual.launch import archive as A
from continual.launch import launcher as L
from continual.launch.experiment import load_experiment, run_config
from continual.launch.queue import Queue
from continual.report.__main__ import main as report_main
from helpers.launch_runs import CARTPOLE, PY, REPO, attempts, env, fake_script, write

pytestmark = pytest.mark.xdist_group("ray")


def configs(tmp_path) -> dict:
    """The entries' configs of the experiment `finished_folder` ran (e.json), as the launcher checks an archive."""
    e = load_experiment(str(tmp_path / "e.json"))
    return {x.name: run_config(x, e.name) for x in e.entries}


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
        write(q.config_path(name), run_config(load_experiment(exp).entries[i], "e"))
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


def test_the_archive_keeps_a_compact_record_of_metrics_and_no_policy_file(tmp_path):
    """Iteration records keep the fields the reports read, episode records lose their wall-clock time, every other
    record and a damaged last line are kept as written; the final policy file stays behind."""
    q = finished_folder(tmp_path, seeds=(1,))
    run = q.run_dir("000_seed=1")
    open(os.path.join(run, "PPO.cleanrl_model"), "wb").write(b"m" * 10)
    it = {"kind": "iteration", "global_step": 64, "time": 1.5, "iteration": 1, "modification": "a",
          "losses/entropy": 0.123456789, "losses/value_loss": 2.0, "pnc/compress": 1.0, "time/learn_s": 0.1,
          "plasticity/trac_scale": 0.5}
    ep = {"kind": "episode", "global_step": 70, "time": 2.5, "modification": "a", "return": 3.0, "length": 9}
    other = {"kind": "switch", "global_step": 80, "time": 3.0, "previous": "a", "modification": "b"}
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for rec in (it, ep, other):
            f.write(json.dumps(rec) + "\n")
        f.write('{"kind": "episode", "glob')  # a run killed mid-line
    kept = Queue(str(tmp_path / "kept"))
    assert A.main([q.folder, kept.folder]) == 0
    copy = kept.run_dir("000_seed=1")
    assert "PPO.cleanrl_model" not in os.listdir(copy)
    lines = gzip.open(os.path.join(copy, "metrics.jsonl.gz")).read().decode().splitlines()
    assert json.loads(lines[0]) == {k: it[k] for k in ("kind", "global_step", "iteration", "modification",
                                                        "losses/entropy", "pnc/compress", "plasticity/trac_scale")}
    assert json.loads(lines[1]) == {k: v for k, v in ep.items() if k != "time"}
    assert json.loads(lines[2]) == other and lines[3] == '{"kind": "episode", "glob'


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
    assert A.verify_manifest(kept.folder) == []
    assert n == 4  # the manifest naming the entry, the run directory, its status, the manifest with its files
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
        if k < 3:  # before its status is in place: the entry is not archived
            assert not A.archived(kept, entry)
            target = Queue(str(tmp_path / f"restore{k}"))
            target.create()
            assert A.restore_entry(kept, target, entry) is False and not os.path.exists(target.run_dir(entry))
        if k > 0:  # the manifest says so: the archive does not verify, and only a folder that has the run redoes it
            assert f"the archive of entry {entry!r} was interrupted" in A.verify_manifest(kept.folder)
            with pytest.raises(UserError, match="interrupted"):
                A.check_archive(kept.folder, configs(tmp_path), "e.json")
        A.check_archive(kept.folder, configs(tmp_path), "e.json", source=q)
        assert A.archive_entry(q, kept, entry) is True  # the next launch finishes the job
        assert A.archived(kept, entry) and sorted(os.listdir(os.path.dirname(kept.run_dir(entry)))) == [entry]
        assert A.verify_manifest(kept.folder) == []


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
        A.check_archive(kept, {"000_seed=7": {"seed": 7}}, other)
    with pytest.raises(UserError, match="configures it differently"):
        A.check_archive(kept, {"000_seed=1": {"seed": 2}}, other)
    appended = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2]}})
    A.check_archive(kept, configs(tmp_path), appended)  # an entry appended: fine
    with pytest.raises(UserError, match="holds another experiment"):
        L.main([other, "--folder", str(tmp_path / "new"), "--archive", kept])
    assert not os.path.exists(tmp_path / "new")
    with pytest.raises(UserError, match="not an experiment folder"):
        A.main([str(tmp_path / "nothing"), str(tmp_path / "kept2")])
    assert not os.path.exists(tmp_path / "kept2")


def test_the_launcher_archives_each_finished_run_and_a_new_folder_runs_only_the_rest(tmp_path, capsys, ray_shutdown):
    """Session 1 finishes seeds 1-2 (seed 3 fails); its scratch folder is lost; session 2, with a new folder and the
    same archive, has seed 3 failed (its carry: continual/launch/carry.py) and with --retry_failed runs it alone,
    resumed from its carried checkpoint."""
    script = fake_script(tmp_path / "s", {"3": ["fail"]})
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2, 3]}, "max_retries": 0})
    kept = Queue(str(tmp_path / "kept"))
    first = str(tmp_path / "scratch1")
    assert L.main([exp, "--folder", first, "--script", script, "--num_cpus", "2", "--archive", kept.folder]) == 1
    assert sorted(os.listdir(os.path.join(kept.folder, "runs"))) == ["000_seed=1", "001_seed=2"]
    assert "checkpoints" not in os.listdir(kept.run_dir("000_seed=1"))
    assert A.verify_manifest(kept.folder) == [] and os.path.exists(os.path.join(kept.folder, "declarations.json"))
    shutil.rmtree(first)
    write(os.path.join(tmp_path, "s", "plan.json"), {})
    second = Queue(str(tmp_path / "scratch2"))
    capsys.readouterr()
    assert L.main([exp, "--folder", second.folder, "--script", script, "--num_cpus", "2", "--archive", kept.folder,
                   "--retry_failed"]) == 0
    out = capsys.readouterr().out
    assert "2 finished entries restored" in out and "1 unfinished entries restored from the carry" in out
    assert [a[1] for a in attempts(second.run_dir("000_seed=1"))] == ["fresh", "end"]  # not run again
    assert [a[1] for a in attempts(second.run_dir("002_seed=3"))] == ["fresh", "resume", "end"]
    assert sorted(os.listdir(os.path.join(kept.folder, "runs"))) == ["000_seed=1", "001_seed=2", "002_seed=3"]
    assert all(kept.status(f"{i:03d}_seed={i + 1}")["state"] == "done" for i in range(3))
    assert A.verify_manifest(kept.folder) == []
    # the new folder went on with the archive's record of the declarations: one revision of the file
    record = json.load(open(os.path.join(second.folder, "declarations.json")))
    assert record == json.load(open(os.path.join(kept.folder, "declarations.json")))
    assert len(record["revisions"]) == 1


# --- the manifest ----------------------------------------------------------------------------------------------------


def archived_folder(tmp_path, seeds=(1, 2, 3)) -> str:
    q = finished_folder(tmp_path, seeds=seeds)
    kept = str(tmp_path / "kept")
    assert A.main([q.folder, kept]) == 0
    return kept


def test_the_archive_writes_a_manifest_of_every_file_it_keeps(tmp_path):
    kept = archived_folder(tmp_path)
    manifest = A.read_manifest(kept)
    files = sorted(os.path.relpath(os.path.join(d, f), kept) for d, _, fs in os.walk(kept) for f in fs)
    assert sorted(manifest["files"]) == [f for f in files if f != "manifest.json"] and manifest["archiving"] == []
    assert len(manifest["files"]) == 1 + 3 * 6  # experiment.json + 3 x (config, status, 4 files of the run)
    for rel, d in manifest["files"].items():
        assert d == A.digest(os.path.join(kept, rel))
    text = open(os.path.join(kept, "manifest.json")).read()
    assert all(f'"{rel}": ' in line for rel, line in zip(sorted(manifest["files"]), text.splitlines()[4:]))
    assert A.verify_manifest(kept) == [] and A.check_manifest(kept) == len(manifest["files"])


def _files(kept):
    return sorted(A.read_manifest(kept)["files"])


def test_verify_finds_an_edited_byte_a_missing_file_and_an_extra_file_at_every_file(tmp_path):
    """Each fault, injected at each file of an archive of three runs (experiment, configs, statuses, run files,
    gzipped metrics, nested plots), is found and named, alone; the pristine copy verifies."""
    kept = archived_folder(tmp_path)
    files = _files(kept)
    assert len(files) >= 15 and {f.split("/")[0] for f in files} == {"experiment.json", "configs", "queue", "runs"}
    for i, rel in enumerate(files):
        for fault in ("edit", "append", "missing", "extra"):
            copy = str(tmp_path / f"c{i}_{fault}")
            shutil.copytree(kept, copy)
            path = os.path.join(copy, rel)
            data = open(path, "rb").read()
            if fault == "edit":  # one bit flipped: the same size
                k = len(data) // 2
                open(path, "wb").write(data[:k] + bytes([data[k] ^ 1]) + data[k + 1:])
                expect = f"{rel} was changed (its sha256 differs)"
            elif fault == "append":  # a byte more: the size differs too
                open(path, "ab").write(b" ")
                expect = f"{rel} was changed ({len(data) + 1} bytes, the manifest says {len(data)})"
            elif fault == "missing":
                os.unlink(path)
                expect = f"{rel} is missing"
            else:  # a file beside it
                extra = os.path.join(os.path.dirname(path), "extra.json")
                open(extra, "w").write("{}")
                expect = f"{os.path.relpath(extra, copy)} is not in the manifest"
            assert A.verify_manifest(copy) == [expect], (rel, fault)
            with pytest.raises(UserError, match="does not match its manifest.json"):
                A.check_manifest(copy)
            shutil.rmtree(copy)
    assert A.verify_manifest(kept) == []
    # several at once: all listed, the first named in the one-line refusal
    os.unlink(os.path.join(kept, files[0]))
    open(os.path.join(kept, files[-1]), "ab").write(b"x")
    assert len(A.verify_manifest(kept)) == 2
    with pytest.raises(UserError, match=rf"\(2 problems; first: {files[0]} is missing\)"):
        A.check_manifest(kept)


def test_a_manifest_that_does_not_match_refuses_the_cli_and_the_launcher_in_one_line_exit_2(tmp_path, capsys):
    kept = archived_folder(tmp_path)
    assert A.main(["--verify", kept]) == 0
    out, err = capsys.readouterr()
    assert "files of" in out and err == ""
    status = os.path.join(kept, "queue", "001_seed=2.status.json")
    open(status, "w").write(open(status).read().replace('"done"', '"done" '))
    # the command line (python -m continual.launch.archive) as a process once; its other refusal in this process
    p = subprocess.run([PY, "-m", "continual.launch.archive", "--verify", kept], capture_output=True, text=True,
                       env=env(), cwd=REPO, timeout=300)
    assert p.returncode == 2 and p.stdout == "", p
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ") and \
        "queue/001_seed=2.status.json was changed (" in p.stderr, p.stderr
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(A.main)(["--write-manifest", kept])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "", out
    assert err.count("\n") == 1 and err.startswith("error: ") and "has a manifest.json already" in err, err
    # the launcher refuses to go on with such an archive, creating nothing
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2, 3]}})
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(L.main)([exp, "--folder", str(tmp_path / "new"), "--archive", kept])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "queue/001_seed=2.status.json was changed" in err
    assert not os.path.exists(tmp_path / "new")


def test_an_archive_from_before_manifests_gets_its_first_one_once(tmp_path):
    kept = archived_folder(tmp_path)
    before = A.read_manifest(kept)
    os.unlink(os.path.join(kept, "manifest.json"))  # as archived before manifests existed
    assert A.verify_manifest(kept) == ["no manifest.json"]
    with pytest.raises(UserError, match="--write-manifest"):
        A.check_archive(kept, configs(tmp_path), "e.json")
    assert A.main(["--write-manifest", kept]) == 0
    assert A.read_manifest(kept) == before and A.verify_manifest(kept) == []
    with pytest.raises(UserError, match="has a manifest.json already"):
        A.main(["--write-manifest", kept])
    with pytest.raises(UserError, match="one of them"):
        A.main(["--verify", kept, "--write-manifest", kept])
    with pytest.raises(UserError, match="not an archived experiment folder"):
        A.main(["--write-manifest", str(tmp_path / "nothing")])


def test_a_report_reads_a_launcher_folder_without_a_manifest_only_when_told(tmp_path):
    q = finished_folder(tmp_path, seeds=(1,))
    assert A.check_manifest(q.folder, require=False) == 0
    with pytest.raises(UserError, match="no manifest.json"):
        A.check_manifest(q.folder)


def test_the_report_refuses_an_archive_whose_manifest_does_not_match_in_one_line_exit_2(tmp_path, capsys):
    """In this process: `python -m continual.report` as a process refuses in one line with exit 2 in
    tests/test_report_robustness.py and tests/test_report_plasticity.py."""
    kept = archived_folder(tmp_path)
    os.unlink(os.path.join(kept, "runs", "002_seed=3", "eval_table.csv"))
    capsys.readouterr()  # what archiving printed
    for kind in ("forgetting", "robustness"):
        with pytest.raises(SystemExit) as e:
            report_main([kind, kept])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and out == "", out
        assert err.count("\n") == 1 and err.startswith("error: ") and \
            "runs/002_seed=3/eval_table.csv is missing" in err, err


# --- compaction to the records a report reads ------------------------------------------------------------------------


def forgetting_archive(tmp_path) -> str:
    """An archive (the archive's own form, with its manifest) of a forgetting experiment whose runs log every kind of
    record: two methods x two seeds over SI -> BR -> SI -> BR, with references, hand-chosen curves."""
    import numpy as np

    from helpers.experiment_folders import write_experiment, write_run

    src = str(tmp_path / "src")
    si, br = "env=MinAtar/SpaceInvaders", "env=MinAtar/Breakout"
    steps, switches = list(range(0, 401, 10)), ((100, si, br), (200, br, si), (300, si, br))
    rng = np.random.default_rng(0)
    plan = [(f"00{i}_{label}", label, seed, {si: list(rng.normal(5, 2, len(steps)).cumsum()),
                                             br: list(rng.normal(1, 1, len(steps)).cumsum())}, steps, switches)
            for i, (label, seed) in enumerate([("PPO", 1), ("PPO", 2), ("PPO_CBP", 1), ("PPO_CBP", 2)])]
    plan += [(f"01{j}_reference", f"reference PPO {t[11:]}", 1, {t: list(np.linspace(0, 40, 11))},
              list(range(0, 101, 10)), ()) for j, t in enumerate((si, br))]
    for name, label, seed, curves, st, sw in plan:
        config = {"exp_name": label, "seed": seed, "architecture": label, "eval_greedy": True, "eval_episodes": 8,
                  "eval_every": 10, "eval_at_switches": True}
        write_run(src, name, config, curves, st, sw)
        task = next(iter(curves))
        with open(os.path.join(src, "runs", name, "metrics.jsonl"), "a") as f:  # what training writes besides
            f.write(json.dumps({"kind": "start", "global_step": 0, "time": 1.0, "resumed": False,
                                "code_revision": {"commit": "abc1234", "dirty": False}}) + "\n")
            for s in st[1:]:
                f.write(json.dumps({"kind": "iteration", "global_step": s, "iteration": s // 10, "time": 2.0 + s,
                                    "modification": task, "losses/entropy": 1.0 / s, "losses/value_loss": 0.5,
                                    "time/learn_s": 0.01}) + "\n")
                f.write(json.dumps({"kind": "episode", "global_step": s, "time": 3.0, "modification": task,
                                    "return": float(s % 7), "length": 30}) + "\n")
                f.write(json.dumps({"kind": "eval", "global_step": s, "modification": task, "mean": 9.0}) + "\n")
            f.write(json.dumps({"kind": "plasticity", "global_step": st[-1], "plasticity/stable_rank": 3.0}) + "\n")
            f.write(json.dumps({"kind": "eval_summary", "global_step": st[-1], "eval_seconds": 1.0}) + "\n")
    write_experiment(src, {"flags": {}, "grid": {}, "declared": {
        "primary_metric": {"name": "cora_forgetting", "task": "MinAtar/SpaceInvaders", "rolling_mean_count": 2},
        "pairs": [["PPO_CBP", "PPO"]], "primary_pair": ["PPO_CBP", "PPO"]}})
    kept = Queue(str(tmp_path / "kept"))
    for name, *_ in plan:
        assert A.archive_entry(Queue(src), kept, name)
    return kept.folder


def test_compacting_to_the_forgetting_records_keeps_the_report_and_records_each_raw_digest(tmp_path, capsys):
    """The forgetting report reads the same from the compact records as from the archive's (report.md, report.json
    and curves.png byte for byte); the compact file holds exactly the switch, start and iteration (step, task)
    records, the same bytes from the same input; the manifest lists the new files and each one's raw digest, and
    round-trips byte for byte (with and without compaction); a second compaction changes nothing, another one is
    refused; a report that needs the dropped records is refused in one line, exit 2."""
    kept = forgetting_archive(tmp_path)
    text = open(os.path.join(kept, "manifest.json")).read()
    A.write_manifest(kept, A.read_manifest(kept))
    assert open(os.path.join(kept, "manifest.json")).read() == text and "compacted" not in text
    raw = {rel: d for rel, d in A.read_manifest(kept)["files"].items() if rel.endswith("/metrics.jsonl.gz")}
    before = {rel: read_jsonl(os.path.join(kept, rel[:-3])) for rel in raw}
    report_main(["forgetting", kept, "--out", str(tmp_path / "r0")])
    shutil.copytree(kept, str(tmp_path / "twin"))

    assert A.main(["--compact", kept, "--records", "forgetting"]) == 0
    report_main(["forgetting", kept, "--out", str(tmp_path / "r1")])
    for name in ("report.md", "report.json", "curves.png"):
        assert (tmp_path / "r1" / name).read_bytes() == (tmp_path / "r0" / name).read_bytes(), name
    manifest = A.read_manifest(kept)
    assert A.verify_manifest(kept) == [] and len(raw) == 6 and set(manifest["compacted"]) == set(raw)
    for rel, d in raw.items():
        assert manifest["compacted"][rel] == {"records": "forgetting", "from": d}
        assert manifest["files"][rel] == A.digest(os.path.join(kept, rel)) != d
        want = [r if r["kind"] != "iteration" else {k: r[k] for k in ("kind", "global_step", "modification")}
                for r in before[rel] if r["kind"] in ("switch", "start", "iteration")]
        assert read_jsonl(os.path.join(kept, rel[:-3])) == want
    text = open(os.path.join(kept, "manifest.json")).read()
    A.write_manifest(kept, A.read_manifest(kept))
    assert open(os.path.join(kept, "manifest.json")).read() == text

    # the same input, the same bytes; again: nothing to do; to other records: refused, nothing written
    twin = str(tmp_path / "twin")
    assert A.compact_folder(twin, A.FORGETTING) == 6
    assert {rel: A.digest(os.path.join(twin, rel)) for rel in raw} == {rel: manifest["files"][rel] for rel in raw}
    assert A.compact_folder(kept, A.FORGETTING) == 0 and open(os.path.join(kept, "manifest.json")).read() == text
    with pytest.raises(UserError, match="holds the 'forgetting' records already"):
        A.compact_folder(kept, A.ARCHIVED)
    assert open(os.path.join(kept, "manifest.json")).read() == text
    for kind, message in (("plasticity", "not what the plasticity report reads"),
                          ("minatar", "keep only the 'forgetting' records")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            report_main([kind, kept])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_compaction_is_refused_before_anything_is_written(tmp_path, capsys):
    """A folder that does not match its manifest, a run whose evaluations are only in its records, flags without
    their partner: one line, exit 2, no file changed. The archive's own form compacted again: the same bytes."""
    kept = forgetting_archive(tmp_path)

    def files() -> dict:
        return {rel: A.digest(os.path.join(kept, rel)) for rel in A.scan(kept)}

    os.unlink(os.path.join(kept, "runs", "003_PPO_CBP", "eval_table.csv"))
    before = files()
    with pytest.raises(UserError, match="runs/003_PPO_CBP/eval_table.csv is missing"):
        A.compact_folder(kept, A.FORGETTING)
    A.commit(kept, "003_PPO_CBP")  # listed as it is now: its evaluations only in metrics.jsonl.gz
    with pytest.raises(UserError, match="runs/003_PPO_CBP has no eval_table.csv"):
        A.compact_folder(kept, A.FORGETTING)
    for argv in (["--compact", kept], ["--records", "forgetting"],
                 ["--compact", kept, "--verify", kept, "--records", "forgetting"]):
        with pytest.raises(SystemExit) as e:
            exit_on_user_error(A.main)(argv)
        assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert files() == before
    assert A.compact_folder(kept, A.ARCHIVED) == 6 and files() == before  # a fixed point; only the manifest grew
    assert A.verify_manifest(kept) == [] and len(A.read_manifest(kept)["compacted"]) == 6
