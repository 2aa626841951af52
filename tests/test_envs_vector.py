"""Switchable environments: RAM effects of modifications, in-place switches, terminated/truncated, classic control."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

from continual.envs.backends import available_modifications, make_backend_env, validate_modification
from continual.envs.grouped import worker_blocks
from continual.envs.modifications.freeway import CAR_COLOUR, CAR_SPEED, CAR_X
from continual.envs.vector import EnvSettings, make_vector_env, regime_slug
from continual.errors import UserError
from continual.testing.processes import alive as _alive

FREEWAY = "ALE/Freeway-v5"


def test_freeway_names_cover_hackatari_and_our_registry():
    names = available_modifications("HackAtari", FREEWAY)
    for n in ("all_green_cars", "stop_all_cars", "stop_random_car"):  # hackatari 0.0.6
        assert n in names
    for n in ("disable_cars", "reverse_car_speed_top", "reverse_car_speed_bottom", "all_pink_cars",
              "stop_all_cars_edge", "stop_all_cars_tunnel", "vary_car_speeds", "speed_mode", "invisible_mode",
              "strobo_mode", "phantom_mode", "blinking_mode", "stop_random_car_develop", "vary_car_speeds_fixed"):
        assert n in names


def test_unknown_modification_is_rejected_with_the_valid_list():
    with pytest.raises(UserError) as e:
        validate_modification("HackAtari", FREEWAY, "all_green_cars vary_cars_speeds")
    msg = str(e.value)
    assert "vary_cars_speeds" in msg and "vary_car_speeds" in msg and "all_green_cars" in msg
    assert "\n" not in msg
    validate_modification("HackAtari", FREEWAY, "all_green_cars  reverse_car_speed_top")  # valid: no error
    with pytest.raises(UserError):
        validate_modification("OCAtari", FREEWAY, "all_green_cars")


def test_in_place_switch_changes_ram_and_keeps_the_same_workers():
    envs = make_vector_env(EnvSettings(env_id=FREEWAY, backend="HackAtari"), 4, "all_green_cars")
    try:
        envs.reset(seed=0)
        pids = envs.worker_pids()
        assert len(pids) == len(worker_blocks(4)) and all(_alive(p) for p in pids)  # min(4, cores) workers
        envs.step(np.zeros(4, dtype=np.int64))
        assert (envs.get_ram()[:, CAR_COLOUR] == 210).all()  # green

        envs.switch("disable_cars all_red_cars", step=1024)
        envs.step(np.zeros(4, dtype=np.int64))
        ram = envs.get_ram()
        assert (ram[:, CAR_COLOUR] == 66).all()  # red
        assert (ram[:, CAR_X] == 3).all()  # moved off-screen
        assert (ram[:, CAR_SPEED] >= 99).all()  # stopped (the game decrements the timer once per frame)
        assert envs.modification == "all_red_cars disable_cars"

        # switching the modification off: the reset restores the unmodified game, no poke lingers
        envs.switch("", step=2048)
        envs.step(np.zeros(4, dtype=np.int64))
        ram = envs.get_ram()
        assert not (ram[:, CAR_COLOUR] == 66).all(axis=1).any()
        assert not (ram[:, CAR_X] == 3).all(axis=1).any()
        assert envs.worker_pids() == pids  # no process created by the switches
    finally:
        envs.close()
    assert not any(_alive(p) for p in pids)  # and none left behind


def test_game_over_is_terminated_and_frame_cap_is_truncated():
    env = make_backend_env("HackAtari", FREEWAY, "")
    env.reset(seed=1)
    for t in range(5000):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            break
    assert (terminated, truncated) == (True, False), "a Freeway game ends by the clock: terminated, not truncated"
    assert 2000 <= t + 1 <= 2100

    env = make_backend_env("HackAtari", FREEWAY, "", max_episode_steps=50)
    env.reset(seed=1)
    flags = [env.step(1)[2:4] for _ in range(50)]
    assert flags[-1] == (False, True) and not any(any(f) for f in flags[:-1])


def test_observation_space_is_the_real_dtype():
    env = make_backend_env("HackAtari", FREEWAY, "")
    obs, _ = env.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert obs.dtype == np.uint8 and env.observation_space.contains(obs)
    env = make_backend_env("HackAtari", FREEWAY, "", obs_mode="obj")
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == env.observation_space.shape


def test_restored_reset_equals_a_fresh_reset():
    """Resets restore a snapshot of the post-reset emulator state instead of re-running ALE's reset frames."""
    a = make_backend_env("HackAtari", FREEWAY, "", repeat_action_probability=0.0)
    b = make_backend_env("HackAtari", FREEWAY, "", repeat_action_probability=0.0)
    a.reset(seed=3)
    b.reset(seed=3)
    for _ in range(40):
        a.step(1)
    obs_a, _ = a.reset()  # restored
    obs_b, _ = b.reset(seed=3)  # fresh
    assert (obs_a == obs_b).all()
    actions = np.random.default_rng(0).integers(0, 3, 300)
    for act in actions:
        oa, ra, *_ = a.step(int(act))
        ob, rb, *_ = b.step(int(act))
        assert (oa == ob).all() and ra == rb
    assert (a.get_ram() == b.get_ram()).all()


@pytest.mark.parametrize("modification", ["", "strobo_mode"])
def test_noop_reset_skipping_frame_processing_gives_the_same_observations(modification: str):
    """NoopReset processes only the frames that end up in the stack; the result equals SB3's NoopResetEnv."""
    from stable_baselines3.common.atari_wrappers import NoopResetEnv

    from continual.envs.vector import NoopReset

    ours = NoopReset(make_backend_env("HackAtari", FREEWAY, modification), noop_max=30)
    sb3 = NoopResetEnv(make_backend_env("HackAtari", FREEWAY, modification), noop_max=30)
    assert ours.lazy
    skipped = []
    original_step = ours.unwrapped.step

    def counting_step(action):
        skipped.append(ours.unwrapped.skip_observations)
        return original_step(action)

    ours.unwrapped.step = counting_step
    for episode in range(6):
        oa, _ = ours.reset(seed=11) if episode == 0 else ours.reset()
        ob, _ = sb3.reset(seed=11) if episode == 0 else sb3.reset()
        assert (oa == ob).all(), f"reset {episode}"
        for act in np.random.default_rng(episode).integers(0, 3, 25):
            ra, rb = ours.step(int(act)), sb3.step(int(act))
            assert (ra[0] == rb[0]).all() and ra[1:4] == rb[1:4]
        assert (ours.unwrapped.get_ram() == sb3.unwrapped.get_ram()).all()
    assert max(skipped) > 0  # some no-ops really skipped their frame processing


def test_random_modifications_are_seeded_per_env():
    def trace(seed: int) -> list[np.ndarray]:
        env = make_backend_env("HackAtari", FREEWAY, "strobo_mode", repeat_action_probability=0.0)
        env.reset(seed=seed)
        return [env.step(0)[0] for _ in range(10)]

    assert all((x == y).all() for x, y in zip(trace(5), trace(5)))
    assert not all((x == y).all() for x, y in zip(trace(5), trace(6)))


@pytest.mark.parametrize("name", ["reverse_car_speed_top", "vary_car_speeds", "speed_mode", "stop_all_cars_edge",
                                  "stop_all_cars_tunnel", "invisible_mode", "phantom_mode", "blinking_mode",
                                  "all_pink_cars", "stop_random_car_develop", "vary_car_speeds_fixed"])
def test_each_freeway_modification_changes_the_game(name: str):
    plain = make_backend_env("HackAtari", FREEWAY, "", repeat_action_probability=0.0)
    modded = make_backend_env("HackAtari", FREEWAY, name, repeat_action_probability=0.0)
    plain.reset(seed=0)
    modded.reset(seed=0)
    differs = False
    for _ in range(60):
        plain.step(0)
        modded.step(0)
        differs |= not (plain.get_ram()[list(CAR_SPEED) + list(CAR_COLOUR) + list(CAR_X)]
                        == modded.get_ram()[list(CAR_SPEED) + list(CAR_COLOUR) + list(CAR_X)]).all()
    assert differs


def test_stop_random_car_develop_pokes_as_hackatari_develop_does():
    """HackAtari's stop_random_car from April 2025 (k4ntz/HackAtari ca3cfbc on): each step one car, uniform over the
    speed bytes 33-42, gets 8 with p = 0.9 (random.choices([0, 1, 2, 3], weights [.1, .3, .3, .3]) > 0), else 0."""
    from continual.envs.modifications.registry import registered

    pokes = []

    class Ram:
        def set_ram(self, address, value):
            pokes.append((address, value))

    hooks = registered("Freeway")["stop_random_car_develop"](Ram(), np.random.default_rng(0))
    n = 20000
    for _ in range(n):
        hooks.step()
    assert len(pokes) == n and {a for a, _ in pokes} == set(range(33, 43)) and {v for _, v in pokes} == {0, 8}
    eights = sum(v == 8 for _, v in pokes) / n
    assert abs(eights - 0.9) < 4 * (0.9 * 0.1 / n) ** 0.5
    counts = np.bincount([a - 33 for a, _ in pokes], minlength=10) / n
    assert np.abs(counts - 0.1).max() < 4 * (0.1 * 0.9 / n) ** 0.5


def test_vary_car_speeds_fixed_is_hackataris_undrawn_order():
    """HackAtari 924dad2..ce3349e: order_cars stays list(range(10)) (its reset hook is unmapped), so the speed byte
    of car i (RAM 33 + i) is frame % (i + 1) at every step of every episode."""
    from continual.envs.modifications.registry import registered

    class Ram:
        def __init__(self):
            self.ram = np.zeros(128, dtype=np.uint8)
            self.pokes = {}

        def get_ram(self):
            return self.ram

        def set_ram(self, address, value):
            self.pokes[address] = value

    env = Ram()
    hooks = registered("Freeway")["vary_car_speeds_fixed"](env, np.random.default_rng(0))
    assert hooks.reset is None
    for frame in (0, 1, 7, 60, 251):
        env.ram[1] = frame
        hooks.step()
        assert env.pokes == {33 + i: frame % (i + 1) for i in range(10)}, frame


def test_cartpole_gravity_switch_changes_the_dynamics():
    envs = make_vector_env(EnvSettings(env_id="CartPole-v1", backend="Gymnasium"), 2, "")
    try:
        envs.reset(seed=0)

        def trajectory() -> np.ndarray:
            obs, _ = envs.reset(seed=0)
            states = [obs]
            for _ in range(15):
                states.append(envs.step(np.ones(2, dtype=np.int64))[0])
            return np.stack(states)

        plain = trajectory()
        envs.switch("gravity=25 masscart=2.0")
        u = envs.unwrapped.envs[0].unwrapped
        assert u.gravity == 25.0 and u.masscart == 2.0
        assert u.total_mass == pytest.approx(2.0 + u.masspole)  # re-derived
        heavy = trajectory()
        assert not np.allclose(plain, heavy)
        envs.switch("")  # back to defaults
        assert envs.unwrapped.envs[0].unwrapped.gravity == 9.8
        assert np.allclose(trajectory(), plain)
    finally:
        envs.close()


def test_gymnasium_backend_rejects_unknown_parameters():
    with pytest.raises(UserError, match="foo=1"):
        validate_modification("Gymnasium", "CartPole-v1", "foo=1")
    with pytest.raises(UserError, match="not a number"):
        validate_modification("Gymnasium", "CartPole-v1", "gravity=abc")
    validate_modification("Gymnasium", "CartPole-v1", "gravity=12 length=0.7")


def test_regime_slug_is_file_safe():
    assert regime_slug("") == "no_modif"
    assert regime_slug("b a") == "a+b"
    assert os.sep not in regime_slug("gravity=1/2")


