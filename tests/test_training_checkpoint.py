"""continual.training.checkpoint.run_dir_of: the one "run directory of a checkpoint path" (startup.py, parse_train_args
and load_policy_file had their own; startup's went up two folders whatever the layout)."""

from __future__ import annotations

import os

import pytest

from continual.training import checkpoint as ckpt_lib
from continual.training import startup


@pytest.mark.parametrize("path, run", [
    ("/r/run1/checkpoints/periodic__step8.cleanrl_model", "/r/run1"),
    ("/r/run1/ppo.cleanrl_model", "/r/run1"),  # a final policy file lies in the run directory itself
    ("/r/run1/checkpoints/../checkpoints/x.cleanrl_model", "/r/run1"),
])
def test_run_dir_of(path, run):
    assert ckpt_lib.run_dir_of(path) == run
    assert ckpt_lib.in_checkpoint_dir(path) == path.endswith("checkpoints/" + os.path.basename(path))
    assert ckpt_lib.checkpoint_dir(run) == os.path.join(run, "checkpoints")


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ckpt_lib.run_dir_of(os.path.join("run", "checkpoints", "x.cleanrl_model")) == str(tmp_path / "run")


def test_startup_has_no_copy():
    assert not hasattr(startup, "run_dir_of")


def test_newest_whole_step_skips_files_that_are_not_whole_archives(tmp_path):
    # the launcher groups resumed DQN seeds by this step: the newest checkpoint that looks whole, by step not by name
    run = str(tmp_path / "run")
    assert ckpt_lib.newest_whole_step(run) is None
    os.makedirs(ckpt_lib.checkpoint_dir(run))
    for name in ("periodic__step900", "switch__a__step1000", "interrupted__step1200"):
        ckpt_lib.save_checkpoint(os.path.join(ckpt_lib.checkpoint_dir(run), name + ckpt_lib.SUFFIX), {"global_step": 1})
    assert ckpt_lib.newest_whole_step(run) == 1200
    with open(os.path.join(ckpt_lib.checkpoint_dir(run), "periodic__step1300" + ckpt_lib.SUFFIX), "wb") as f:
        f.write(b"PK\x03\x04 cut short")  # a write cut by a kill
    assert ckpt_lib.newest_whole_step(run) == 1200
    os.unlink(os.path.join(ckpt_lib.checkpoint_dir(run), "interrupted__step1200" + ckpt_lib.SUFFIX))
    assert ckpt_lib.newest_whole_step(run) == 1000
