"""continual.launch.code: an experiment folder pinned to a git revision runs it from a worktree at every launch (and
on a new machine, from its archive's carry) while the checkout moves on; a launch that would run other code is refused
in one line, exit 2, before anything is written, unless --code_change records the move.

The repository here is a small git repository of its own (continual.launch.code.REPO points at it): two commits of
a stand-in training script that writes which commit it is into each run; the worktrees go to a temporary cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from continual.errors import UserError
from continual.launch import code as C
from continual.launch import launcher as L
from continual.launch.queue import Queue
from helpers.launch_runs import CARTPOLE, FAKE, PY, REPO, env, write

pytestmark = pytest.mark.xdist_group("ray")


def git(cwd, *args) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def commit_script(src, mark: str) -> str:
    """Commit a stand-in training script that appends `mark` to its run's ran_at file; the commit's sha."""
    anchor = "n = len(open("  # after the run directory is known, before the attempt fails or ends
    assert anchor in FAKE
    mark_line = f"open(os.path.join(run_dir, 'ran_at'), 'a').write({mark!r} + '\\n')\n"
    with open(os.path.join(src, L.SCRIPT), "w") as f:
        f.write(FAKE.replace(anchor, mark_line + anchor, 1))
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", mark)
    return git(src, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with commits A and B of the stand-in script (seed 2 fails at its first two attempts), HEAD at B;
    the worktrees in a temporary cache."""
    src = tmp_path / "src"
    src.mkdir()
    git(src, "init", "-q")
    write(src / "plan.json", {"2": ["fail", "fail", "ok"]})
    a = commit_script(src, "A")
    b = commit_script(src, "B")
    monkeypatch.setattr(C, "REPO", str(src))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return {"src": str(src), "A": a, "B": b}


def experiment(tmp_path) -> str:
    return write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2]}, "max_retries": 0})


def ran_at(q: Queue, name: str) -> list[str]:
    with open(os.path.join(q.run_dir(name), "ran_at")) as f:
        return f.read().split()


def pins(folder) -> list:
    with open(os.path.join(folder, "declarations.json")) as f:
        return [(p["commit"], p["change"]) for p in json.load(f).get(C.KEY, [])]


def test_a_pinned_folder_runs_its_revision_at_every_launch_and_refuses_other_code(tmp_path, repo, ray_shutdown):
    exp, q = experiment(tmp_path), Queue(str(tmp_path / "f"))
    base = [exp, "--folder", q.folder, "--num_cpus", "2"]
    assert L.main([*base, "--code", repo["A"][:7]]) == 1  # seed 2 fails
    tree = C.worktree_path(repo["A"])
    assert os.path.isfile(os.path.join(tree, L.SCRIPT)) and C.code_revision(tree)["commit"] == repo["A"]
    assert ran_at(q, "000_seed=1") == ["A"] and ran_at(q, "001_seed=2") == ["A"]
    assert pins(q.folder) == [(repo["A"], False)]
    # the checkout is at B; a launch without --code runs the pin
    assert L.main([*base, "--retry_failed"]) == 1
    assert ran_at(q, "001_seed=2") == ["A", "A"] and ran_at(q, "000_seed=1") == ["A"]
    record = open(os.path.join(q.folder, "declarations.json")).read()
    for other in (["--code", "HEAD"], ["--script", os.path.join(repo["src"], L.SCRIPT)]):
        with pytest.raises(UserError, match=f"pinned to {repo['A'][:12]}.*--code_change"):
            L.main([*base, "--retry_failed", *other])
        assert open(os.path.join(q.folder, "declarations.json")).read() == record
    assert L.main([*base, "--retry_failed", "--code", "HEAD", "--code_change"]) == 0
    assert ran_at(q, "001_seed=2") == ["A", "A", "B"]
    assert pins(q.folder) == [(repo["A"], False), (repo["B"], True)]
    assert L.main(base) == 0  # and the moved pin is the one that runs from now on, without --code_change
    assert pins(q.folder) == [(repo["A"], False), (repo["B"], True)]


def test_a_new_machine_runs_the_pin_its_carry_recorded(tmp_path, repo, ray_shutdown):
    """The folder and the worktree are lost with the machine; a new folder restored from the archive's carry makes the
    worktree again and resumes the failed seed with the pinned commit, not the checkout's."""
    exp, kept = experiment(tmp_path), str(tmp_path / "kept")
    first = str(tmp_path / "scratch1")
    assert L.main([exp, "--folder", first, "--num_cpus", "2", "--archive", kept, "--code", repo["A"]]) == 1
    assert pins(os.path.join(kept, "carry")) == [(repo["A"], False)]
    shutil.rmtree(first)
    shutil.rmtree(C.cache_dir())  # still registered with git: the next worktree add prunes it first
    second = Queue(str(tmp_path / "scratch2"))
    assert L.main([exp, "--folder", second.folder, "--num_cpus", "2", "--archive", kept, "--retry_failed"]) == 1
    assert ran_at(second, "001_seed=2") == ["A", "A"]
    assert pins(second.folder) == [(repo["A"], False)]


def test_a_pin_moved_after_the_last_archived_entry_is_the_one_a_new_machine_runs(tmp_path, repo, ray_shutdown):
    """The archive's record was copied before the pin moved, the carry's after: the longer list is the newer."""
    exp, kept = experiment(tmp_path), str(tmp_path / "kept")
    first = str(tmp_path / "scratch1")
    base = [exp, "--num_cpus", "2", "--archive", kept]
    assert L.main([*base, "--folder", first, "--code", repo["A"]]) == 1
    assert L.main([*base, "--folder", first, "--code", repo["B"], "--code_change", "--retry_failed"]) == 1
    assert pins(os.path.join(kept, "carry")) == [(repo["A"], False), (repo["B"], True)]
    assert pins(kept) == [(repo["A"], False)]  # written when seed 1 was archived
    shutil.rmtree(first)
    second = Queue(str(tmp_path / "scratch2"))
    assert L.main([*base, "--folder", second.folder, "--retry_failed"]) == 0
    assert ran_at(second, "001_seed=2") == ["A", "B", "B"]
    assert pins(second.folder) == [(repo["A"], False), (repo["B"], True)]


def test_a_script_at_the_pinned_commit_with_unchanged_files_may_run_it(tmp_path, repo, ray_shutdown):
    exp, q = experiment(tmp_path), Queue(str(tmp_path / "f"))
    assert L.main([exp, "--folder", q.folder, "--num_cpus", "2", "--code", repo["B"]]) == 1
    clone = str(tmp_path / "clone")
    git(tmp_path, "clone", "-q", repo["src"], clone)
    script = os.path.join(clone, L.SCRIPT)
    assert L.main([exp, "--folder", q.folder, "--num_cpus", "2", "--script", script, "--retry_failed"]) == 1
    assert ran_at(q, "001_seed=2") == ["B", "B"] and pins(q.folder) == [(repo["B"], False)]
    with open(script, "a") as f:
        f.write("# edited\n")
    with pytest.raises(UserError, match="not that revision with its tracked files unchanged"):
        L.main([exp, "--folder", q.folder, "--num_cpus", "2", "--script", script, "--retry_failed"])
    # --code_change runs it, and a checkout with changed files pins nothing: the folder is unpinned, recorded
    assert L.main([exp, "--folder", q.folder, "--num_cpus", "2", "--script", script, "--retry_failed",
                   "--code_change"]) == 0
    assert pins(q.folder) == [(repo["B"], False), (None, True)]
    assert C.pinned(json.load(open(os.path.join(q.folder, "declarations.json")))[C.KEY]) is None


def test_refusals_come_before_anything_is_written(tmp_path, repo):
    exp = experiment(tmp_path)
    folder = str(tmp_path / "f")
    cases = [(["--code", "nosuchrev"], "no commit of the checkout"),
             (["--code", repo["A"], "--script", os.path.join(repo["src"], L.SCRIPT)], "drop --script"),
             (["--code", repo["A"], "--resume_id", "7"], "resume_id")]
    for flags, message in cases:
        with pytest.raises(UserError, match=message):
            L.main([exp, "--folder", folder, *flags])
        assert not os.path.exists(folder) and not os.path.exists(C.cache_dir())
    os.makedirs(C.worktree_path(repo["A"]))  # something else where the worktree goes
    with pytest.raises(UserError, match="is not the worktree of"):
        L.main([exp, "--folder", folder, "--code", repo["A"]])
    assert not os.path.exists(folder)
    C.REPO = str(tmp_path)  # no checkout (monkeypatch restores it)
    with pytest.raises(UserError, match="not a git checkout"):
        L.main([exp, "--folder", folder, "--code", "HEAD"])


def test_a_dry_run_with_code_makes_no_worktree(tmp_path, repo, capsys):
    exp = experiment(tmp_path)
    assert L.main([exp, "--folder", str(tmp_path / "f"), "--code", repo["A"], "--dry_run"]) == 0
    assert f"code: {repo['A'][:12]}" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "f") and not os.path.exists(C.cache_dir())


def test_the_cli_refuses_an_unknown_revision_in_one_line_with_exit_2(tmp_path):
    exp = experiment(tmp_path)
    p = subprocess.run([PY, "-m", "continual.launch", exp, "--folder", str(tmp_path / "f"), "--code", "nosuchrev"],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "nosuchrev" in p.stderr
    assert not os.path.exists(tmp_path / "f")
