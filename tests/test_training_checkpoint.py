"""continual.training.checkpoint.run_dir_of: the one "run directory of a checkpoint path" (startup.py, parse_train_args
and load_policy_file had their own; startup's went up two folders whatever the layout)."""

from __future__ import annotations

import os
import re

import numpy as np
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


def test_numpy_scalars_are_saved_as_python_values_and_load_back(tmp_path):
    # C-CHAIN's automatic coefficient was a numpy float64 after its warm-up: the checkpoints of a 20-hour experiment
    # were written and then refused at --resume. The save now writes what the loader reads.
    import collections

    import torch

    model = torch.nn.Linear(2, 1).state_dict()
    payload = {"architecture": "DQN", "args": {}, "model": model, "global_step": np.int64(7),
               "c_chain": {"coef": np.float64(0.25), "flags": [np.bool_(True), (np.float32(1.5), "a")]},
               "rng": {"numpy": {"state": {"state": 2 ** 100, "inc": 3}}}, "size": torch.Size([2, 3])}
    path = ckpt_lib.save_checkpoint(str(tmp_path / "a" / "x.cleanrl_model"), payload)
    back = ckpt_lib.load_checkpoint(path)
    assert back["global_step"] == 7 and type(back["global_step"]) is int
    assert back["c_chain"] == {"coef": 0.25, "flags": [True, (1.5, "a")]}
    assert type(back["c_chain"]["coef"]) is float and type(back["c_chain"]["flags"][0]) is bool
    assert back["rng"]["numpy"]["state"]["state"] == 2 ** 100 and back["size"] == torch.Size([2, 3])
    assert all(torch.equal(back["model"][k], model[k]) for k in model)
    assert type(payload["c_chain"]["coef"]) is np.float64  # the caller's payload is not changed
    # unchanged containers are not copied; a changed OrderedDict keeps its type and its state_dict _metadata
    assert ckpt_lib.plain(model) is model
    od = collections.OrderedDict(w=torch.zeros(1), n=np.int64(2))
    od._metadata = {"": {"version": 1}}
    got = ckpt_lib.plain(od)
    assert type(got) is collections.OrderedDict and got._metadata == od._metadata and type(got["n"]) is int


@pytest.mark.parametrize("value, named", [(np.zeros(2), "checkpoint['x'][1] is a numpy.ndarray"),
                                          (slice(2), "checkpoint['x'][1] is a builtins.slice"),
                                          (object(), "checkpoint['x'][1] is a builtins.object")])
def test_a_value_the_loader_would_refuse_fails_the_save_naming_where_it_is(tmp_path, value, named):
    from continual.errors import TrainingError

    path = str(tmp_path / "x.cleanrl_model")
    with pytest.raises(TrainingError, match=re.escape(named)):
        ckpt_lib.save_checkpoint(path, {"x": [1, value]})
    assert not os.path.exists(path)
