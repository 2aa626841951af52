"""The MinAtar backend against MinAtar itself, its `name=value` modifications, the padding that gives a sequence of
games one observation space, and a two-game MinAtar sequence switching in place in the same worker processes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from minatar import Environment

from continual.envs.backends import (
    MINATAR_GAMES,
    MinAtarEnv,
    PadTask,
    TaskCompat,
    make_backend_env,
    minatar_actions,
    minatar_permutation,
    task_compat,
    validate_modification,
)
from continual.envs.vector import EnvSettings, TaskIdObservation, make_vector_env
from continual.errors import UserError

GAMES = [f"MinAtar/{g}" for g in MINATAR_GAMES]


def reference_run(module: str, seed: int, actions, sticky: float = 0.1, ramping: bool = True) -> list[np.ndarray]:
    """MinAtar's own Environment, seeded and driven by hand: the (10, 10, C) bool states, channels moved first."""
    env = Environment(module, sticky_action_prob=sticky, difficulty_ramping=ramping)
    env.seed(seed)
    env.reset()
    states = [env.state().transpose(2, 0, 1).astype(np.float32)]
    for a in actions:
        _, done = env.act(a)
        states.append(env.state().transpose(2, 0, 1).astype(np.float32))
        if done:
            break
    return states


def ours_run(env, seed: int, actions) -> list[np.ndarray]:
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for a in actions:
        obs, _, terminated, truncated, _ = env.step(a)
        out.append(obs)
        if terminated or truncated:
            break
    return out


@pytest.mark.parametrize("env_id", GAMES)
def test_observations_match_minatar(env_id):
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 6, 300).tolist()
    env = MinAtarEnv(env_id)
    assert env.action_space.n == 6 and env.observation_space.dtype == np.float32
    ours = ours_run(env, 7, actions)
    ref = reference_run(MINATAR_GAMES[env_id.split("/")[1]], 7, actions)
    assert len(ours) == len(ref) and all(np.array_equal(a, b) for a, b in zip(ours, ref))
    assert ours[0].shape == env.observation_space.shape


def test_modifications_switch_in_place_as_minatar_built_with_them():
    """sticky_action_prob / difficulty_ramping set on a live env equal MinAtar built with those parameters, and a
    string without them goes back to the defaults."""
    actions = np.random.default_rng(1).integers(0, 6, 400).tolist()
    env = make_backend_env("MinAtar", "MinAtar/Breakout", "")
    for mod, sticky, ramping in [("sticky_action_prob=0.5 difficulty_ramping=0", 0.5, False),
                                 ("sticky_action_prob=1", 1.0, True), ("", 0.1, True),
                                 ("difficulty_ramping=0", 0.1, False)]:
        env.set_modifications(mod)
        ours = ours_run(env, 3, actions)
        ref = reference_run("breakout", 3, actions, sticky=sticky, ramping=ramping)
        assert len(ours) == len(ref) and all(np.array_equal(a, b) for a, b in zip(ours, ref)), mod
    # the parameters make a difference here (else the comparison above proves nothing)
    assert not all(np.array_equal(a, b) for a, b in zip(reference_run("breakout", 3, actions, sticky=1.0),
                                                         reference_run("breakout", 3, actions, sticky=0.0)))


@pytest.mark.parametrize("bad", ["gravity=3", "sticky_action_prob=2", "difficulty_ramping=0.5", "sticky_action_prob=x",
                                 "sticky_action_prob=0.1 sticky_action_prob=0.2", "env=MinAtar/Pong",
                                 "env=MinAtar/Breakout env=MinAtar/Freeway", "env=ALE/Pong-v5",
                                 "permute_obs=-1", "permute_obs=1.5", "permute_actions=x", "permute_obs=inf",
                                 "permute_actions=nan", "permute_obs", "permute_obs=1 permute_obs=2",
                                 "no_reward_cutoff=-1", "no_reward_cutoff=2.5"])
def test_bad_modifications_are_one_line_errors(bad):
    with pytest.raises(UserError) as e:
        validate_modification("MinAtar", "MinAtar/Breakout", bad)
    assert "\n" not in str(e.value)


def test_no_reward_cutoff_truncates_an_episode_without_reward():
    """C-CHAIN's Seaquest rule (crl_minatar/crl_run_double_dqn.py: `if ep_step_count >= 1000 and ep_reward < 0.1:
    break`): a Seaquest sub that never dives scores nothing and is never done; with no_reward_cutoff=N its episode is
    truncated (not terminated) at step N. An episode with a reward by then goes on; 0 and the default never cut."""
    def noop_episode(modification: str, steps: int) -> tuple[int, bool]:
        env = MinAtarEnv("MinAtar/Seaquest", modification)
        env.reset(seed=3)
        for t in range(1, steps + 1):
            _, reward, terminated, truncated, _ = env.step(0)
            assert reward == 0 and not terminated
            if truncated:
                return t, True
        return steps, False

    assert noop_episode("no_reward_cutoff=1000 sticky_action_prob=0", 1500) == (1000, True)
    assert noop_episode("no_reward_cutoff=40", 100) == (40, True)
    assert noop_episode("no_reward_cutoff=0", 1500) == (1500, False)
    assert noop_episode("", 1500) == (1500, False)
    # random SpaceInvaders with a cutoff of 12: episodes without a point by step 12 end there, truncated; those with
    # one by then go on past it (both kinds occur)
    env = MinAtarEnv("MinAtar/SpaceInvaders", "no_reward_cutoff=12")
    rng = np.random.default_rng(0)
    cut = went_on = 0
    env.reset(seed=0)
    for _ in range(100):
        total, t = 0.0, 0
        while True:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(0, 6)))
            total, t = total + reward, t + 1
            if t == 12 and total > 0:
                went_on += 1
            if terminated or truncated:
                break
        assert not (terminated and truncated)
        if truncated:
            assert t == 12 and total == 0
            cut += 1
        env.reset()
    assert cut > 5 and went_on > 5


def test_permutation_from_k_by_hand():
    """K = 0 is the identity; K > 0 is numpy's permutation from seed K (drawn again while it moves nothing)."""
    assert minatar_permutation(0, 6) is None
    for k in range(1, 30):
        for n in (3, 4, 6, 10):
            perm = minatar_permutation(k, n)
            rng = np.random.default_rng(k)
            expected = rng.permutation(n)
            while (expected == np.arange(n)).all():
                expected = rng.permutation(n)
            assert np.array_equal(perm, expected) and sorted(perm) == list(range(n)) and (perm != np.arange(n)).any()
    assert np.array_equal(minatar_permutation(7, 4), minatar_permutation(7, 4))  # fixed: the same in every run


@pytest.mark.parametrize("env_id", GAMES)
def test_permute_obs_shows_the_games_channels_reordered(env_id):
    """With permute_obs=K, observation channel c is the unpermuted game's channel perm_K[c] (same seed, same
    actions: the game itself is untouched)."""
    actions = np.random.default_rng(2).integers(0, 6, 300).tolist()
    plain = ours_run(MinAtarEnv(env_id), 5, actions)
    env = MinAtarEnv(env_id, "permute_obs=4")
    perm = minatar_permutation(4, env.observation_space.shape[0])
    permuted = ours_run(env, 5, actions)
    assert len(plain) == len(permuted) > 5
    for a, b in zip(plain, permuted):
        assert np.array_equal(b, np.stack([a[c] for c in perm]))  # hand-reordered, channel by channel
    assert any(not np.array_equal(a, b) for a, b in zip(plain, permuted))  # the reordering shows


@pytest.mark.parametrize("env_id", ["MinAtar/Breakout", "MinAtar/SpaceInvaders-v1"])
def test_permute_actions_plays_the_mapped_action(env_id):
    """With permute_actions=K, agent action a reaches MinAtar as the env id's action perm_K[a] (recorded at the
    game's own act, below every wrapper)."""
    env = MinAtarEnv(env_id, "permute_actions=3 sticky_action_prob=0")
    seen: list[int] = []
    act = env.game.act
    env.game.act = lambda a: (seen.append(int(a)), act(a))[1]
    env.reset(seed=0)
    actions = minatar_actions(env_id)
    perm = minatar_permutation(3, len(actions))
    for a in range(len(actions)):
        env.step(a)
    assert seen == [actions[perm[a]] for a in range(len(actions))] != list(actions)


def test_permutations_switch_in_place_and_back():
    """set_modifications takes effect at the next reset, on the same env object, and '' goes back to the identity."""
    actions = np.random.default_rng(3).integers(0, 6, 200).tolist()
    env = make_backend_env("MinAtar", "MinAtar/Breakout", "")
    plain = ours_run(env, 9, actions)
    for k in (1, 2, 5):
        env.set_modifications(f"permute_obs={k} permute_actions={k}")
        inv = np.argsort(minatar_permutation(k, 6))  # play the actions that map back to the plain run's
        permuted = ours_run(env, 9, [int(inv[a]) for a in actions])
        perm = minatar_permutation(k, 4)
        assert len(permuted) == len(plain) and all(np.array_equal(b, a[perm]) for a, b in zip(plain, permuted)), k
    env.set_modifications("")
    assert all(np.array_equal(a, b) for a, b in zip(plain, ours_run(env, 9, actions)))


def test_task_compat_pads_channels_to_the_largest_game():
    channels = {g: MinAtarEnv(g).observation_space.shape[0] for g in GAMES}
    assert channels == {"MinAtar/Asterix": 4, "MinAtar/Breakout": 4, "MinAtar/Freeway": 7, "MinAtar/Seaquest": 10,
                        "MinAtar/SpaceInvaders": 6}  # MinAtar 1.0.15's grids
    assert task_compat("MinAtar", ("MinAtar/Breakout", "MinAtar/Freeway")) == TaskCompat((7, 10, 10), 6)
    assert task_compat("MinAtar", ("MinAtar/Breakout",)) == TaskCompat()  # one game: nothing changes
    env = PadTask(MinAtarEnv("MinAtar/Breakout"), (10, 10, 10), 6)
    obs, _ = env.reset(seed=0)
    raw = MinAtarEnv("MinAtar/Breakout").reset(seed=0)[0]
    assert obs.shape == (10, 10, 10) and env.observation_space.shape == (10, 10, 10)
    assert np.array_equal(obs[:4], raw) and not obs[4:].any()


def test_padded_discrete_actions_act_as_the_last_action():
    class Recorder(MinAtarEnv):
        seen: list = []

        def step(self, action):
            self.seen.append(action)
            return super().step(action)

    inner = Recorder("MinAtar/Breakout")
    inner.action_space = gym.spaces.Discrete(3)  # a task with fewer actions than the sequence
    env = PadTask(inner, None, 6)
    env.reset(seed=0)
    for a in range(6):
        env.step(a)
    assert env.action_space.n == 6 and Recorder.seen == [0, 1, 2, 2, 2, 2]


def test_ppo_network_for_padded_grids():
    from agents.ppo import Agent

    agent = Agent((10, 10, 10), 6)
    x = torch.zeros((5, 10, 10, 10))
    action, logp, entropy, value = agent.get_action_and_value(x)
    assert action.shape == (5,) and value.shape == (5, 1)


@pytest.mark.parametrize("prebuild", [True, False])
def test_two_game_sequence_switches_in_the_same_workers(prebuild):
    """Breakout -> Seaquest -> Breakout (a cycle) in 2 worker processes: the pids stay, the worker's env really is
    the other game (its first observation is the reference Seaquest's, seeded from the run's seed and the step),
    whether the workers built Seaquest at their start (`games`) or at the switch."""
    games = ("MinAtar/Breakout", "MinAtar/Seaquest")
    settings = EnvSettings(env_id="MinAtar/Breakout", backend="MinAtar", compat=task_compat("MinAtar", games),
                           games=games if prebuild else ())
    envs = make_vector_env(settings, 2, "env=MinAtar/Breakout", "async")
    try:
        obs, _ = envs.reset(seed=10)
        pids = envs.worker_pids()
        assert len(pids) == 2 and obs.shape == (2, 10, 10, 10)
        for i in range(2):
            assert np.array_equal(obs[i, :4], MinAtarEnv("MinAtar/Breakout").reset(seed=10 + i)[0])
        obs, _ = envs.switch("env=MinAtar/Seaquest sticky_action_prob=0", step=1000)
        assert envs.worker_pids() == pids and envs.env.call("game") == (games[1], games[1])
        for i in range(2):
            seed = int(np.random.SeedSequence([10 + i, 1000]).generate_state(1)[0])
            assert np.array_equal(obs[i], MinAtarEnv("MinAtar/Seaquest").reset(seed=seed)[0])
        for _ in range(20):
            obs, *_ = envs.step(np.array([1, 5]))
        assert obs[:, 4:].any()  # Seaquest fills channels Breakout does not have
        obs, _ = envs.switch("", step=2000)  # no env token: the run's --env_id, Breakout
        assert envs.worker_pids() == pids and envs.env.call("game") == (games[0], games[0])
        assert not obs[:, 4:].any()
    finally:
        envs.close()


def test_task_id_input_appends_a_one_hot_of_the_task():
    """--task_id_input: (C, H, W) grids get one constant plane per task (1 on the current task's), vectors one
    entry per task; a string outside the task list gets zeros. Checked against hand-built arrays."""
    tasks = ("env=MinAtar/Breakout", "env=MinAtar/Freeway")
    env = TaskIdObservation(MinAtarEnv("MinAtar/Breakout"), tasks, "env=MinAtar/Freeway")
    assert env.observation_space.shape == (6, 10, 10)
    obs, _ = env.reset(seed=0)
    raw = MinAtarEnv("MinAtar/Breakout").reset(seed=0)[0]
    expected = np.concatenate([raw, np.zeros((1, 10, 10)), np.ones((1, 10, 10))]).astype(np.float32)
    assert np.array_equal(obs, expected)
    env.set_task("sticky_action_prob=0")
    assert not env.step(0)[0][4:].any()
    vec = TaskIdObservation(gym.make("CartPole-v1"), ("a", "b", "c"), "b")
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (7,) and np.array_equal(obs[4:], [0, 1, 0])
    assert np.array_equal(obs[:4], gym.make("CartPole-v1").reset(seed=0)[0])


def test_task_id_follows_switches_in_the_workers():
    tasks = ("env=MinAtar/Breakout", "env=MinAtar/Freeway", "env=MinAtar/Freeway sticky_action_prob=0")
    games = ("MinAtar/Breakout", "MinAtar/Freeway")
    settings = EnvSettings(env_id="MinAtar/Breakout", backend="MinAtar", compat=task_compat("MinAtar", games),
                           games=games, task_ids=tasks)
    envs = make_vector_env(settings, 2, tasks[0], "async")
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 10, 10, 10)  # Freeway's 7 channels + 3 tasks
        for i, m in [(0, tasks[0]), (1, tasks[1]), (2, tasks[2]), (0, tasks[0])]:
            if m != envs.modification:
                obs, _ = envs.switch(m, step=i + 1)
            obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
            assert np.array_equal(obs[:, 7:].max(axis=(2, 3)), np.eye(3)[[i, i]]), m
    finally:
        envs.close()


def test_minatar_imports_without_its_display_libraries():
    """minatar's environment module imports seaborn and pyplot (~2 s a process): the backend makes them load on
    first use; they still work when used, and an import after that gets the real modules."""
    import subprocess
    import sys

    code = """
import sys
from continual.envs.backends import make_backend_env
make_backend_env("MinAtar", "MinAtar/Breakout", "").reset(seed=0)
print(sorted(m for m in ("seaborn", "scipy.stats", "matplotlib.pyplot") if m in sys.modules))
import minatar.environment as me
assert len(me.sns.color_palette("cubehelix", 3)) == 3 and callable(me.plt.figure)
import seaborn
import matplotlib.pyplot as plt
print(seaborn is me.sns._real and plt is me.plt._real and type(seaborn).__name__ == "module")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout + out.stderr
