"""bench/freeway_drop.py's windows, drops, curves and CIs on small synthetic records, checked by hand (no training)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import BENCH, ROOT, load_bench

VISITS = [("", 0, 100), ("speed_mode", 100, 160), ("", 160, 260)]


@pytest.fixture(scope="module")
def fd():
    return load_bench("freeway_drop")


def ep(step, ret, env, mod=""):
    return {"global_step": step, "return": float(ret), "length": 10, "modification": mod, "env": env}


def run(a1, b, a2):
    """Two envs; visit 1 has three games per env (ends 30/60/90), visit 2 two (130, 150), visit 3 three (190/220/250).
    a1, b, a2: per game index, the (env 0, env 1) returns."""
    eps = []
    for (ends, rets, mod) in (((30, 60, 90), a1, ""), ((130, 150), b, "speed_mode"), ((190, 220, 250), a2, "")):
        for end, (r0, r1) in zip(ends, rets):
            eps += [ep(end + 1, r1, 1, mod), ep(end, r0, 0, mod)]  # out of order on purpose: grouping sorts by step
    return eps


def test_visits_of_a_sequential_config(fd):
    cfg = {"modification_factory_kwargs": {"num_total_steps": 260, "modifications": ["", "speed_mode", ""],
                                           "switching_thresholds": [100, 160]}}
    assert fd.visits_of(cfg) == VISITS


def test_shipped_config_visits_end_half_way_through_a_game(fd):
    """Every visit of configs/freeway_obj_drop.json is a whole number of rollouts and ends in the middle of a game
    (2,048 agent steps per env), so no logged game straddles a switch and none ends right at one."""
    cfg = json.load(open(os.path.join(ROOT, "configs", "freeway_obj_drop.json")))
    envs, rollout = cfg["num_envs"], cfg["num_envs"] * cfg["num_steps"]
    for _, start, end in fd.visits_of(cfg):
        assert (end - start) % rollout == 0
        assert ((end - start) // envs) % 2048 == 1024


def test_games_by_index_groups_the_k_th_game_of_every_env(fd):
    eps = run([(1, 2), (3, 4), (5, 6)], [(0, 1), (0, 0)], [(7, 8), (9, 10), (11, 12)])
    by_k = fd.games_by_index(eps, VISITS[1])
    assert [[(e["env"], e["return"]) for e in g] for g in by_k] == [[(0, 0.0), (1, 1.0)], [(0, 0.0), (1, 0.0)]]
    by_k = fd.games_by_index(eps, VISITS[2])
    assert [sorted(e["return"] for e in g) for g in by_k] == [[7, 8], [9, 10], [11, 12]]
    # an episode at exactly a visit's end belongs to it; one just after it to the next visit
    assert len(fd.games_by_index([ep(100, 1, 0)], VISITS[0])) == 1
    assert fd.games_by_index([ep(100, 1, 0)], VISITS[1]) == []
    with pytest.raises(ValueError, match="speed_mode"):  # a game tagged with another regime than its visit's
        fd.games_by_index([ep(120, 1, 0, "")], VISITS[1])


def test_window_means_first_and_last_games(fd):
    eps = run([(1, 2), (3, 4), (5, 6)], [(0, 1), (0, 0)], [(7, 8), (9, 10), (11, 12)])
    assert fd.window_means(eps, VISITS[0]) == (1.5, 5.5)
    assert fd.window_means(eps, VISITS[0], games=2) == (2.5, 4.5)  # (1+2+3+4)/4, (3+4+5+6)/4
    assert fd.window_means(eps, VISITS[1]) == (0.5, 0.0)
    assert fd.window_means(eps, VISITS[2], games=3) == (9.5, 9.5)


def test_summarize_drops_and_curve(fd):
    runs = {"PPO": {1: run([(1, 2), (3, 4), (20, 22)], [(0, 1), (0, 0)], [(7, 8), (9, 10), (20, 20)]),
                    2: run([(1, 2), (3, 4), (22, 24)], [(2, 3), (0, 0)], [(1, 2), (9, 10), (22, 22)])}}
    s = fd.summarize(runs, VISITS, reps=500)["methods"]["PPO"]
    assert s["seeds"] == [1, 2]
    v1, v2, v3 = s["visits"]
    assert v1["first_by_seed"] == [1.5, 1.5] and v1["last_by_seed"] == [21.0, 23.0]
    assert v1["last"] == {"mean": 22.0, "ci95": [21.0, 23.0], "n": 2} and "change_at_switch" not in v1
    assert v2["first_by_seed"] == [0.5, 2.5] and v2["last_by_seed"] == [0.0, 0.0]
    assert v2["change_at_switch_by_seed"] == [0.5 - 21.0, 2.5 - 23.0]  # the drop: B's first game minus A's last
    assert v2["change_at_switch"]["mean"] == pytest.approx(-20.5)
    assert v3["change_at_switch_by_seed"] == [7.5 - 0.0, 1.5 - 0.0]
    assert v3["last"]["mean"] == 21.0
    c = s["curve"]
    assert c["n"] == [2] * 8
    # visit 1, game 0: seeds' means 1.5 and 1.5; steps (30 + 31)/2 in both seeds
    assert c["step"][:3] == [30.5, 60.5, 90.5] and c["step"][3:5] == [130.5, 150.5] and c["step"][5] == 190.5
    assert c["mean"] == [1.5, 3.5, 22.0, 1.5, 0.0, 4.5, 9.5, 21.0]
    assert c["lo"][2] == 21.0 and c["hi"][2] == 23.0  # two seeds: the CI spans their values
    assert c["lo"][5] == 1.5 and c["hi"][5] == 7.5


def test_summarize_a_seed_missing_a_game(fd):
    """A seed whose visit logged fewer games counts only where it has them (n per curve point)."""
    short = [e for e in run([(1, 1), (2, 2), (3, 3)], [(0, 0), (0, 0)], [(5, 5), (6, 6), (7, 7)])
             if e["global_step"] < 250]
    full = run([(1, 1), (2, 2), (3, 3)], [(0, 0), (0, 0)], [(5, 5), (6, 6), (9, 9)])
    s = fd.summarize({"PPO": {1: short, 2: full}}, VISITS, reps=200)["methods"]["PPO"]
    assert s["visits"][2]["last_by_seed"] == [6.0, 9.0]
    assert s["curve"]["n"][-1] == 1 and s["curve"]["mean"][-1] == 9.0


@pytest.mark.parametrize("argv, message", [
    (["--methods", "PPO,DQN"], "--methods: unknown"),
    (["--seeds", "0"], "--seeds"),
    (["--config", "/nonexistent/x.json"], "--config"),
])
def test_bad_input_exits_2_before_creating_anything(tmp_path, argv, message):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "freeway_drop.py"), *argv, "--runs_dir", str(out / "runs"),
                        "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: ") and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
