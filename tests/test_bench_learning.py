"""bench/learning.py's statistics on small synthetic record sets, checked by hand (no training)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def learning():
    return load_bench("learning")


def test_final_return_is_the_mean_of_the_last_tenth_of_episodes(learning):
    assert learning.final_return(list(range(1, 21))) == 19.5  # 20 episodes: the last 2 (19, 20)
    assert learning.final_return(list(range(1, 16))) == 14.5  # 15 episodes: ceil(1.5) = 2 -> 14, 15
    assert learning.final_return([3.0, 1.0, 7.0, 2.0, 5.0]) == 5.0  # 5 episodes: at least one, the last
    assert learning.final_return([0.0] * 90 + [10.0] * 10) == 10.0  # 100 episodes: exactly the last 10
    assert learning.final_return([0.0] * 89 + [10.0] * 11) == 10.0
    assert learning.final_return([0.0] * 91 + [10.0] * 9) == 9.0  # one 0 of the last 10
    assert math.isnan(learning.final_return([]))


def test_binned_curve_by_hand(learning):
    steps, returns = [5, 10, 15, 25, 40, 41], [1, 2, 3, 4, 5, 100]
    curve = learning.binned_curve(steps, returns, np.array([10, 20, 30, 40, 50, 60]))
    # (0,10]: 1, 2 -> 1.5; (10,20]: 3; (20,30]: 4; (30,40]: 5 (40 ends the bin it closes); (40,50]: 100; (50,60]: none
    assert curve[:5].tolist() == [1.5, 3.0, 4.0, 5.0, 100.0]
    assert math.isnan(curve[5])


def test_summarize_on_a_synthetic_record_set(learning):
    # agent A, game G: seed 1 has returns 0..9 (one episode per 10 steps), seed 2 has 10 episodes of 2 then of 4
    results = {
        ("PPO", "Breakout", 1): {"steps": list(range(10, 101, 10)), "returns": list(range(10)), "wall_s": 3.0,
                                 "cpu_s": 2.0},
        ("PPO", "Breakout", 2): {"steps": list(range(5, 101, 5)), "returns": [2.0] * 10 + [4.0] * 10,
                                 "wall_s": 5.0, "cpu_s": 4.0},
    }
    s = learning.summarize(results, steps=100, points=2, reps=4000)
    assert s["grid"] == [50, 100]
    g = s["games"]["Breakout"]["PPO"]
    # finals: seed 1 -> last 1 of 10 episodes = 9; seed 2 -> last 2 of 20 = 4
    assert g["final_by_seed"] == {"1": 9.0, "2": 4.0}
    assert g["final_mean"] == 6.5 and g["n"] == 2
    assert g["final_ci95"] == [4.0, 9.0]  # two seeds: resamples {4,4}, {4,9}, {9,4}, {9,9}, each 25%
    # curve: (0,50]: seed 1 mean(0..4) = 2, seed 2 mean of 2s = 2 -> 2; (50,100]: seed 1 mean(5..9) = 7, seed 2: 4
    assert g["curve_mean"] == [2.0, 5.5]
    assert g["curve_lo"][0] == g["curve_hi"][0] == 2.0
    assert g["curve_lo"][1] == 4.0 and g["curve_hi"][1] == 7.0
    assert g["episodes_by_seed"] == {"1": 10, "2": 20}


def test_bad_agent_or_game_is_one_line_and_exit_2(learning, tmp_path, capsys):
    runs = tmp_path / "runs"
    for argv in (["--agents", "PPO,SAC"], ["--games", "Pong"], ["--seeds", "0"]):
        with pytest.raises(SystemExit) as e:
            learning.main([*argv, "--runs_dir", str(runs), "--out", str(tmp_path / "out")])
        assert e.value.code == 2
        err = capsys.readouterr()
        assert err.out == "" and err.err.startswith("error: ") and err.err.count("\n") == 1
    assert not runs.exists() and not (tmp_path / "out").exists()
