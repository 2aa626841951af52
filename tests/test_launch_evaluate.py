"""continual.launch.evaluate: eval.py once per finished run of an experiment folder, into DIR/<run>.json, the JSONs
equal to eval.py's own for that run; unfinished runs and runs already evaluated are left alone; a failure is named
and the others go on; bad input is one line and exit 2 before anything is written."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import run_main, write_config
from continual.launch import evaluate

FLAGS = ["--greedy", "--eval_episodes", "2", "--modifs", "", "gravity=15"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An experiment folder with one finished CartPole run, one unfinished (no final policy yet) and one whose final
    policy is not a policy (its evaluation fails)."""
    tmp = tmp_path_factory.mktemp("evaluate")
    cfg = write_config(tmp, {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64,
                             "update_epochs": 1, "total_timesteps": 256}, "cfg.json")
    runs = tmp / "exp" / "runs"
    run_main("continual_training_example.py", "--config", str(cfg), "--runs_dir", str(runs), "--run_name",
             "000_seed=1", "--exp_name", "ppo", "--no-progress-bar")
    (runs / "001_seed=2").mkdir()
    shutil.copy(runs / "000_seed=1" / "config.json", runs / "001_seed=2")
    (runs / "002_seed=3").mkdir()
    shutil.copy(runs / "000_seed=1" / "config.json", runs / "002_seed=3")
    (runs / "002_seed=3" / "ppo.cleanrl_model").write_bytes(b"not a policy")
    return str(tmp / "exp")


def test_each_finished_run_once_as_eval_py_would(folder, tmp_path, capsys):
    into = str(tmp_path / "greedy")
    assert evaluate.main([folder, "--into", into, "--", *FLAGS]) == 1  # the broken policy fails, the others go on
    out = capsys.readouterr()
    assert sorted(os.listdir(into)) == ["000_seed=1.csv", "000_seed=1.json"]
    assert "002_seed=3: eval.py exited" in out.err and "1 evaluated, 1 failed (002_seed=3)" in out.out
    got = json.load(open(os.path.join(into, "000_seed=1.json")))
    assert got["greedy"] is True and [r["modification"] for r in got["results"]] == ["", "gravity=15"]
    assert got["checkpoint"].endswith(os.path.join("000_seed=1", "ppo.cleanrl_model"))
    # eval.py itself on the same run: the same rows
    direct = str(tmp_path / "direct")
    run_main("eval.py", "--agent_path", os.path.join(folder, "runs", "000_seed=1", "ppo.cleanrl_model"),
             "--output", direct, "--no-progress-bar", *FLAGS)
    assert json.load(open(direct + ".json"))["results"] == got["results"]
    # a second pass leaves the evaluated run alone and retries only the failed one
    stamp = os.stat(os.path.join(into, "000_seed=1.json")).st_mtime_ns
    assert evaluate.pending(folder, into) == [("002_seed=3", os.path.join(folder, "runs", "002_seed=3",
                                                                          "ppo.cleanrl_model"))]
    evaluate.main([folder, "--into", into, "--", *FLAGS])
    assert os.stat(os.path.join(into, "000_seed=1.json")).st_mtime_ns == stamp


@pytest.mark.parametrize("argv,words", [
    (["{folder}", "--into", "{into}", "--", "--output", "x"], "--output is set per run by this tool"),
    (["{folder}", "--into", "{into}", "--", "--agent_path=x"], "--agent_path is set per run by this tool"),
    (["{folder}", "--into", "{into}", "--watch", "0"], "--watch must be a positive number of seconds"),
    (["{into}", "--into", "{into}"], "no runs/ folder"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(folder, tmp_path, capsys, argv, words):
    into = str(tmp_path / "out")
    with pytest.raises(SystemExit) as e:
        evaluate.main([a.format(folder=folder, into=into) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and words in err[0], err
    assert not os.path.exists(into)
