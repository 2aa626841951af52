"""continual.launch.device: entries of an experiment file run for a fixed time (here: to their end) and come back
packed, one archive per entry plus device.json; bad input is one line and exit 2 before anything is created."""

from __future__ import annotations

import json
import os
import tarfile

import pytest

from conftest import ROOT, exit_2
from continual.launch import device
from continual.launch.experiment import load_experiment
from helpers.launch_runs import CARTPOLE, write


def experiment(tmp_path) -> str:
    return write(tmp_path / "e.json", {"flags": {**CARTPOLE, "total_timesteps": 256}, "grid": {"seed": [1, 2]}})


@pytest.mark.parametrize("argv, message", [
    (["--entries", "2"], "has entries 0-1, not 2"),
    (["--entries", "0", "--seconds", "0"], "--seconds must be positive"),
])
def test_bad_input_is_one_line_before_anything_is_created(tmp_path, capsys, argv, message):
    seconds = [] if "--seconds" in argv else ["--seconds", "60"]
    _, err = exit_2(device.main, [experiment(tmp_path), *argv, *seconds, "--out", str(tmp_path / "out"),
                                  "--folder", str(tmp_path / "f")], capsys)
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == ["e.json"]


@pytest.mark.slow
def test_an_entry_runs_and_comes_back_packed(tmp_path):
    exp = experiment(tmp_path)
    name = load_experiment(exp).entries[1].name
    out = tmp_path / "out"
    device.main([exp, "--entries", "1", "--seconds", "600", "--out", str(out), "--folder", str(tmp_path / "f"),
                 "--script", os.path.join(ROOT, "continual_training_example.py")])
    assert set(os.listdir(out)) == {"device.json", f"{name}.tar.gz"}  # entry 0 was not asked for
    report = json.loads((out / "device.json").read_text())
    assert report["runs"][name]["rc"] == 0 and report["runs"][name]["steps"] == 256, report
    with tarfile.open(out / f"{name}.tar.gz") as tar:
        members = tar.getnames()
    assert {f"{name}/device.log", f"{name}/metrics.jsonl", f"{name}/config.json"} <= set(members), members
    assert not [m for m in members if m.endswith(".cleanrl_model")]  # checkpoints only with --keep-checkpoints
