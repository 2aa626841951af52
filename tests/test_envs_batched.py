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
    # permuted channels and actions, switched in place and back
    ("MinAtar/SpaceInvaders-v1", [(0, "permute_obs=1"), (150, "permute_obs=2 permute_actions=2"),
                                  (300, "permute_actions=5"), (450, "")], None),
    # no_reward_cutoff (C-CHAIN's Seaquest rule), on and off across game swaps, with a time limit beside it
    ("MinAtar/Seaquest", [(0, "no_reward_cutoff=15"), (200, "env=MinAtar/SpaceInvaders"),
                          (350, "env=MinAtar/Seaquest no_reward_cutoff=25")], 60),
], ids=["one-game", "switch-and-time-limit", "three-games", "minimal-actions", "permutations", "no-reward-cutoff"])
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
    if "cutoff" in str(schedule):  # cut before the time limit (a truncation at a length other than the limit)
        lengths = [b[4]["final_info"]["episode"]["l"][b[3]] for b in sync if len(b) == 5 and b[3].any()]
        assert {15, 25} <= set(np.concatenate(lengths).tolist())


def test_batched_permutations_by_hand():
    """The batched env (which steps the games below the stack) shows permute_obs's reordered channels and plays
    permute_actions's mapped actions: a permuted run equals the plain run with its actions mapped and its
    observations' channels reordered by hand, across a switch into the permuted regime."""
    from continual.envs.backends import minatar_permutation

    regime = "permute_obs=6 permute_actions=6 sticky_action_prob=0"
    settings = settings_for("MinAtar/Breakout", ("sticky_action_prob=0", regime))
    obs_perm, act_perm = minatar_permutation(6, 4), minatar_permutation(6, 6)
    rng = np.random.default_rng(1)
    actions = rng.integers(0, 6, (300, 3))
    plain_envs = make_vector_env(settings, 3, "sticky_action_prob=0", "batched")
    perm_envs = make_vector_env(settings, 3, "sticky_action_prob=0", "batched")
    try:
        assert isinstance(perm_envs.unwrapped, MinAtarVectorEnv)
        plain_envs.reset(seed=4)
        perm_envs.reset(seed=4)
        plain, _ = plain_envs.switch("sticky_action_prob=0", step=0, seed=7)
        permuted, _ = perm_envs.switch(regime, step=0, seed=7)  # switched in place: the same env objects
        np.testing.assert_array_equal(permuted, plain[:, obs_perm])
        assert all(port is not None for port in perm_envs.unwrapped._row_port)  # the numpy port plays permuted games
        ends = 0
        for a in actions:
            plain, r1, t1, u1, _ = plain_envs.step(act_perm[a])  # the game actions the permuted run's a stand for
            permuted, r2, t2, u2, _ = perm_envs.step(a)
            np.testing.assert_array_equal(permuted, plain[:, obs_perm])
            np.testing.assert_array_equal(r1, r2)
            np.testing.assert_array_equal(t1, t2)
            ends += int(t1.sum())
        assert ends > 3  # through episode ends and resets
    finally:
        plain_envs.close()
        perm_envs.close()


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
