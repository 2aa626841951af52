"""continual.envs.grouped: several envs per worker process, step for step what gymnasium's AsyncVectorEnv gives (the
reference: one env per process), through in-place switches and game swaps; a killed worker; the learner's death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from continual.config.loading import parse_args
from continual.envs.backends import task_compat
from continual.envs.grouped import GroupedVectorEnv, batch_infos, worker_blocks
from continual.envs.vector import ContinualVectorEnv, EnvSettings, make_env, make_vector_env
from continual.errors import EnvWorkerError
from continual.testing.processes import alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_envs_per_worker_flag_reaches_the_vector_env():
    args, _ = parse_args(["--env_id", "CartPole-v1", "--backend", "Gymnasium", "--envs_per_worker", "3"])
    assert EnvSettings.from_args(args).envs_per_worker == 3


def test_worker_blocks_spread_the_envs_contiguously():
    assert worker_blocks(8, cores=2) == [range(0, 4), range(4, 8)]
    assert worker_blocks(10, cores=4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert worker_blocks(3, cores=16) == [range(0, 1), range(1, 2), range(2, 3)]
    assert worker_blocks(5, envs_per_worker=2) == [range(0, 2), range(2, 4), range(4, 5)]


class AddInfo(gym.vector.VectorEnv):
    """gymnasium's own batching, env by env (`VectorEnv._add_info`): the reference."""

    def __init__(self, num_envs: int):
        self.num_envs = num_envs


def test_infos_batched_by_column_as_gymnasium_batches_them_env_by_env():
    rng = np.random.default_rng(1)
    infos = []
    for i in range(7):
        info = {"lives": int(rng.integers(0, 4)), "frame_number": np.int64(i), "ratio": [1, 2.5][i % 2]}
        if i % 3 == 1:  # an episode ended here (SAME_STEP), some keys only in some envs
            info = {"final_info": {**info, "episode": {"r": float(i), "l": i, "t": 0.5}}, "final_obs": np.full(3, i),
                    "extra": np.arange(2) + i, "note": ("a", i), **info}
        infos.append(info if i != 5 else {})
    expected: dict = {}
    for i, info in enumerate(infos):
        expected = AddInfo(7)._add_info(expected, info, i)
    got = batch_infos([(i, info) for i, info in enumerate(infos) if info], 7)

    def same(a, b):
        assert list(a) == list(b)
        for key in a:
            if isinstance(a[key], dict):
                same(a[key], b[key])
            else:
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
                for x, y in zip(a[key], b[key]):
                    assert np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object)), key

    same(got, expected)
    assert got["ratio"].dtype == np.int64 and got["ratio"][3] == 2  # the first env's type, as gymnasium's


def pair(settings: EnvSettings, num_envs: int, modification: str, envs_per_worker: int):
    """(ours, gymnasium's AsyncVectorEnv) over the same env constructors, both with in-place switches."""
    fns = [make_env(settings, i, modification) for i in range(num_envs)]
    ctx = settings.worker_context().get_start_method()
    ours = ContinualVectorEnv(GroupedVectorEnv(fns, ctx, envs_per_worker), modification)
    ref = ContinualVectorEnv(gym.vector.AsyncVectorEnv(fns, context=ctx, autoreset_mode=AutoresetMode.SAME_STEP),
                             modification)
    return ours, ref


def equal(a, b) -> bool:
    """Observations equal (arrays, or the dicts of arrays of goal envs)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return a.dtype == b.dtype and np.array_equal(a, b)


def assert_same_run(ours, ref, steps: int, switches: dict) -> int:
    """Reset, then `steps` random-action steps with `switches` ({step: modification}); every output equal (episode
    statistics: returns and lengths; their "t" is a wall time). Returns the number of episodes that ended."""
    rng = np.random.default_rng(0)
    a, b = ours.reset(seed=7), ref.reset(seed=7)
    assert equal(a[0], b[0]) and a[1].keys() == b[1].keys()
    episodes = 0
    for t in range(steps):
        if t in switches:
            a, b = ours.switch(switches[t], t, seed=t), ref.switch(switches[t], t, seed=t)
            assert equal(a[0], b[0]), t
        space = ours.single_action_space
        actions = rng.integers(0, space.n, ours.num_envs) if isinstance(space, gym.spaces.Discrete) else \
            rng.uniform(-3, 3, (ours.num_envs, *space.shape)).astype(space.dtype)
        a, b = ours.step(actions), ref.step(actions)
        for x, y in zip(a[:4], b[:4]):
            assert equal(x, y), t
        assert a[4].keys() == b[4].keys(), t
        for key in ("lives", "_lives", "_final_info", "_final_obs"):
            if key in b[4]:
                assert np.array_equal(a[4][key], b[4][key]), (t, key)
        if "final_info" in b[4]:
            episodes += int(b[4]["final_info"]["_episode"].sum())
            ea, eb = a[4]["final_info"]["episode"], b[4]["final_info"]["episode"]
            for key in ("r", "_r", "l", "_l"):
                assert np.array_equal(ea[key], eb[key]), (t, key)
            for i in np.flatnonzero(b[4]["_final_obs"]):
                assert equal(a[4]["final_obs"][i], b[4]["final_obs"][i]), t
    return episodes


def test_freeway_pixels_through_a_switch_into_stop_random_car_equal_gymnasium():
    """4 envs, 2 per worker. stop_random_car draws from Python's global `random` at every frame: envs sharing a
    process and its stream would draw other cars than their own processes do, and the frames would differ."""
    settings = EnvSettings(env_id="ALE/Freeway-v5", backend="HackAtari", max_episode_steps=40)
    ours, ref = pair(settings, 4, "", envs_per_worker=2)
    try:
        assert len(ours.worker_pids()) == 2 and len(ref.worker_pids()) == 4
        episodes = assert_same_run(ours, ref, 130, {50: "stop_random_car"})
        assert episodes >= 8  # time-limit ends, before and after the switch, with their statistics
        assert ours.env.call("modification") == ("stop_random_car",) * 4
    finally:
        ours.close()
        ref.close()


def test_minatar_through_a_game_swap_equal_gymnasium():
    games = ("MinAtar/Breakout", "MinAtar/SpaceInvaders")
    settings = EnvSettings(env_id=games[0], backend="MinAtar", compat=task_compat("MinAtar", games), games=games)
    ours, ref = pair(settings, 3, "env=MinAtar/Breakout", envs_per_worker=2)
    try:
        pids = ours.worker_pids()
        episodes = assert_same_run(ours, ref, 600, {200: "env=MinAtar/SpaceInvaders", 400: "env=MinAtar/Breakout"})
        assert episodes >= 3
        assert ours.worker_pids() == pids and ours.env.call("game") == (games[0],) * 3
    finally:
        ours.close()
        ref.close()


def test_box_actions_through_shared_memory_equal_gymnasium():
    settings = EnvSettings(env_id="Pendulum-v1", backend="Gymnasium", max_episode_steps=30)
    ours, ref = pair(settings, 3, "", envs_per_worker=2)
    try:
        assert assert_same_run(ours, ref, 70, {35: "max_torque=1.0"}) == 6
    finally:
        ours.close()
        ref.close()


def test_goal_env_dict_observations_through_shared_memory_equal_gymnasium():
    settings = EnvSettings(env_id="continual/GoalGrid-v0", backend="Gymnasium", her=True, max_episode_steps=20)
    ours, ref = pair(settings, 3, "", envs_per_worker=2)
    try:
        assert isinstance(ours.single_observation_space, gym.spaces.Dict)
        assert assert_same_run(ours, ref, 60, {}) >= 3
    finally:
        ours.close()
        ref.close()


def test_a_killed_worker_is_one_line_naming_its_envs_and_nothing_is_left():
    settings = EnvSettings(env_id="CartPole-v1", backend="Gymnasium", envs_per_worker=2)
    envs = make_vector_env(settings, 4, "", "async")
    pids = envs.worker_pids()
    try:
        envs.reset(seed=0)
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(EnvWorkerError) as e:
            for _ in range(5):
                envs.step(np.zeros(4, dtype=np.int64))
        assert str(e.value) == f"environment worker died: envs 2-3 (pid {pids[1]}) exited with code -9"
    finally:
        envs.close()
    assert not any(alive(p) for p in pids)


LEARNER = """
import sys, time
from continual.envs.vector import EnvSettings, make_vector_env
if __name__ == "__main__":
    envs = make_vector_env(EnvSettings(env_id="CartPole-v1", backend="Gymnasium", envs_per_worker=2), 4, "", "async")
    envs.reset(seed=0)
    print(*envs.worker_pids(), flush=True)
    time.sleep(600)
"""


def test_workers_die_with_their_learner(tmp_path):
    script = tmp_path / "learner.py"
    script.write_text(LEARNER)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)
