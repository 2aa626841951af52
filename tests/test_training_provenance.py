"""continual/training/provenance.py on real git repositories: the commit and local changes of the library's own
checkout, None outside one; runs record it in config.json and at every start in metrics.jsonl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from continual.training.provenance import ROOT, code_revision

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="git not installed")


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_commit_and_local_changes_of_a_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "one")
    head = git(repo, "rev-parse", "HEAD")
    assert code_revision(str(repo)) == {"commit": head, "dirty": False}
    (repo / "untracked.txt").write_text("not ours\n")
    assert code_revision(str(repo)) == {"commit": head, "dirty": False}  # untracked files do not count
    (repo / "a.py").write_text("x = 2\n")
    assert code_revision(str(repo)) == {"commit": head, "dirty": True}


def test_no_revision_outside_a_checkout(tmp_path):
    # a directory inside a repository but not its root (a package installed into some other project's tree)
    (tmp_path / "outer").mkdir()
    git(tmp_path / "outer", "init", "-q")
    inner = tmp_path / "outer" / "site-packages"
    inner.mkdir()
    assert code_revision(str(inner)) is None
    assert code_revision(str(tmp_path / "missing")) is None


def test_runs_record_the_revision_at_every_start(tmp_path):
    """A run's config.json and its metrics.jsonl "start" records (the first start and a resume) carry this
    checkout's revision."""
    if not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("the library is not a git checkout here")
    from agents import ppo

    expected = code_revision()
    common = ["--backend", "Gymnasium", "--env_id", "CartPole-v1", "--num_envs", "2", "--num_steps", "16",
              "--total_timesteps", "64", "--checkpoint_every", "32", "--runs_dir", str(tmp_path), "--no-progress-bar"]
    run_dir = ppo.main([*common, "--run_name", "first"])
    with open(os.path.join(run_dir, "config.json")) as f:
        assert json.load(f)["code_revision"] == expected
    ckpts = sorted(p for p in os.listdir(os.path.join(run_dir, "checkpoints")) if not p.startswith("final"))
    ppo.main(["--resume", os.path.join(run_dir, "checkpoints", ckpts[0])])
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        starts = [r for r in map(json.loads, f) if r["kind"] == "start"]
    assert [(r["resumed"], r["code_revision"]) for r in starts] == [(False, expected), (True, expected)]
    assert starts[1]["global_step"] == 32
