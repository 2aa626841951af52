"""continual.envs.batched: MinAtar's batched vector env plays the same games as gymnasium's SyncVectorEnv over the
same stacks, step by step, through episode ends, time limits, modification switches and game swaps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from continual.config.args import Args
from continual.envs.batched import MinAtarVectorEnv
from continual.envs.vector import EnvSettings, make_vector_env


def settings_for(env_id: str, regimes: tuple[str, ...], **overrides) -> EnvSettings:
    args = dataclasses.replace(Args(), backend="MinAtar", env_id=env_id)
    return EnvSettings.from_args(args, regimes=regimes, **overrides)


def assert_same_step(a: tuple, b: tuple, where: str) -> None:
    for x, y, name in zip(a[:4], b[:4], ("obs", "rewards", "terminations", "truncations")):
        np.testing.assert_array_equal(x, y, err_msg=f"{name} at {where}")
        assert x.dtype == y.dtype, (name, x.dtype, y.dtype)
    ia, ib = a[4], b[4]
    assert set(ia) == set(ib), (where, set(ia), set(ib))
    if "final_obs" in ib:
        np.testing.assert_array_equal(ia["_final_obs"], ib["_final_obs"])
        for i in np.flatnonzero(ib["_final_obs"]):
            np.testing.assert_array_equal(ia["final_obs"][i], ib["final_obs"][i], err_msg=where)
        ea, eb = ia["final_info"]["episode"], ib["final_info"]["episode"]
        np.testing.assert_array_equal(ia["final_info"]["_episode"], ib["final_info"]["_episode"])
        for k in ("r", "l"):
            np.testing.assert_array_equal(ea[k], eb[k], err_msg=f"episode {k} at {where}")
            assert ea[k].dtype == eb[k].dtype


def play(settings: EnvSettings, kind: str, n: int, schedule: list[tuple[int, str]], steps: int) -> list:
    envs = make_vector_env(settings, n, schedule[0][1], kind)
    assert isinstance(envs.unwrapped, MinAtarVectorEnv) == (kind == "batched")
    rng = np.random.default_rng(0)
    out = [envs.reset(seed=11)]
    try:
        switches = dict(schedule[1:])
        for t in range(steps):
            if t in switches:
                out.append(envs.switch(switches[t], step=t, seed=100 + t))
            actions = rng.integers(0, envs.single_action_space.n, n)
            out.append(envs.step(actions))
    finally:
        envs.close()
    return out


@pytest.mark.parametrize("env_id,schedule,limit", [
    ("MinAtar/Breakout", [(0, "")], None),
    ("MinAtar/SpaceInvaders", [(0, ""), (300, "sticky_action_prob=0.5 difficulty_ramping=0")], 40),
    # three games (4, 6 and 10 channels: zero-padded; swapped in place), revisiting the first
    ("MinAtar/Breakout", [(0, ""), (150, "env=MinAtar/Seaquest"), (300, "env=MinAtar/SpaceInvaders"),
                          (450, "env=MinAtar/Breakout")], None),
    # -v1: minimal action sets of different sizes (Breakout 3, Asterix 5): the smaller set's missing actions
    ("MinAtar/Breakout-v1", [(0, ""), (200, "env=MinAtar/Asterix-v1")], 60),
], ids=["one-game", "switch-and-time-limit", "three-games", "minimal-actions"])
def test_batched_plays_the_games_the_sync_vector_env_plays(env_id, schedule, limit):
    regimes = tuple(m for _, m in schedule)
    settings = settings_for(env_id, regimes, max_episode_steps=limit)
    sync = play(settings, "sync", 4, schedule, 600)
    batched = play(settings, "batched", 4, schedule, 600)
    ends = 0
    for t, (a, b) in enumerate(zip(batched, sync)):
        if len(b) == 2:  # a reset or switch
            np.testing.assert_array_equal(a[0], b[0])
            continue
        assert_same_step(a, b, f"entry {t}")
        ends += int(np.sum(b[2] | b[3]))
    assert ends > 10  # episodes ended (and reset) along the way
    if limit is not None:
        assert any(np.any(b[3]) for b in sync if len(b) == 5)  # the time limit was hit


def test_auto_picks_batched_for_minatar_and_sync_where_a_wrapper_acts_every_step(tmp_path):
    plain = settings_for("MinAtar/Breakout", ("",))
    for settings, expected in ((plain, MinAtarVectorEnv),
                               (dataclasses.replace(plain, video_dir=str(tmp_path)), None),
                               (dataclasses.replace(plain, task_ids=("", "x")), None)):
        envs = make_vector_env(settings, 2, "", "auto")
        try:
            assert isinstance(envs.unwrapped, MinAtarVectorEnv) == (expected is not None)
        finally:
            envs.close()
