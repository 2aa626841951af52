"""continual.envs.minatar_numpy: the numpy ports play exactly MinAtar's games: for the same seeds and actions, the
same observations, rewards and terminals as `minatar.Environment`, step by step, and MinAtar's RandomState left
where MinAtar's own stepping leaves it."""

from __future__ import annotations

import numpy as np
import pytest
from minatar import Environment

from continual.envs.backends import MinAtarEnv
from continual.envs.minatar_numpy import BLOCK, PORTS, port_name

GAMES = {"breakout": "MinAtar/Breakout", "space_invaders": "MinAtar/SpaceInvaders", "freeway": "MinAtar/Freeway"}


def play(module: str, env_id: str, modification: str, sticky: float, ramping: bool, seeds: list[int], steps: int,
         rows_step=None, craft=None) -> int:
    """Step a port and MinAtar's Environments side by side; returns the number of episodes that ended.
    `craft(rng, env, ref_env)`: changes both games' fresh state the same way after every reset."""
    craft_rng = np.random.default_rng(seeds[-1])
    cores = [MinAtarEnv(env_id, modification) for _ in seeds]
    refs = [Environment(module, sticky_action_prob=sticky, difficulty_ramping=ramping) for _ in seeds]
    width = cores[0].action_space.n
    port = PORTS[module](len(seeds), width)
    for i, (core, ref, seed) in enumerate(zip(cores, refs, seeds)):
        assert port_name(core) == module
        core.reset(seed=seed)
        ref.seed(seed)
        ref.reset()
        if craft:
            craft(craft_rng, core.game.env, ref.env)
        port.load(i, core)
    rng = np.random.default_rng(seeds[0])
    obs = np.zeros((len(seeds), 10, 10, 10), np.float32)  # more channels than the game's: a padded row
    ends = 0
    for t in range(steps):
        idx = np.arange(len(seeds)) if rows_step is None else rows_step(t)
        actions = rng.integers(0, width, len(idx))
        rewards, terminals = port.step(idx, actions, obs)
        for k, i in enumerate(idx):
            r, done = refs[i].act(cores[i].actions[actions[k]])
            where = f"{module} seed {seeds[i]} step {t}"
            assert rewards[k] == r and terminals[k] == done, (where, rewards[k], r, terminals[k], done)
            np.testing.assert_array_equal(obs[i, :port.channels], refs[i].state().transpose(2, 0, 1), err_msg=where)
            assert not obs[i, port.channels:].any()
            if done:  # as MinAtarVectorEnv: RandomState settled, MinAtar's reset, the fresh state loaded
                ends += 1
                port.settle(i)
                cores[i].reset()
                refs[i].reset()
                refs[i].last_action = 0
                if craft:
                    craft(craft_rng, cores[i].game.env, refs[i].env)
                port.load(i, cores[i])
    for i in range(len(seeds)):
        port.settle(i)
        a, b = cores[i].game.random.get_state(), refs[i].random.get_state()
        assert a[2] == b[2] and np.array_equal(a[1], b[1])  # the same stream position
    return ends


@pytest.mark.parametrize("module", list(GAMES))
@pytest.mark.parametrize("sticky,ramping", [(0.1, True), (0.0, True), (0.5, False)])
def test_port_plays_minatars_game(module, sticky, ramping):
    mod = f"sticky_action_prob={sticky} difficulty_ramping={int(ramping)}"
    ends = play(module, GAMES[module], mod, sticky, ramping, [3, 4, 5], 1500 if module != "freeway" else 2600)
    assert ends >= (8 if module != "freeway" else 3)  # Freeway: 2,500 steps a game


def few_bricks(rng, env, ref):
    """Breakout with 0-3 bricks left anywhere above the paddle row: the wall refills when the ball comes down."""
    bricks = np.zeros((10, 10))
    for _ in range(rng.integers(0, 4)):
        bricks[rng.integers(0, 9), rng.integers(0, 10)] = 1
    env.brick_map, ref.brick_map = bricks.copy(), bricks.copy()


def few_aliens(rng, env, ref):
    """SpaceInvaders with a few aliens anywhere (the bottom rows too), any direction and timers: waves cleared (the
    difficulty ramps), aliens landing, shots from any column."""
    aliens = np.zeros((10, 10))
    for _ in range(rng.integers(1, 5)):
        aliens[rng.integers(0, 10), rng.integers(0, 10)] = 1
    values = dict(alien_map=aliens, alien_dir=int(rng.choice([-1, 1])), alien_move_timer=int(rng.integers(0, 4)),
                  alien_shot_timer=int(rng.integers(0, 10)), shot_timer=int(rng.integers(0, 5)),
                  enemy_move_interval=int(rng.integers(6, 13)), pos=int(rng.integers(0, 10)))
    for game in (env, ref):
        for k, v in values.items():
            setattr(game, k, v.copy() if isinstance(v, np.ndarray) else v)


def near_the_top(rng, env, ref):
    """Freeway with the chicken anywhere (crossings: new car speeds drawn mid-episode), the cars anywhere, and a
    short time left (episode ends)."""
    xs = rng.integers(0, 10, 8)
    values = dict(pos=int(rng.integers(1, 10)), terminate_timer=int(rng.integers(20, 200)),
                  move_timer=int(rng.integers(0, 4)))
    for game in (env, ref):
        for k, v in values.items():
            setattr(game, k, v)
        for car, x in zip(game.cars, xs):
            car[0] = int(x)


@pytest.mark.parametrize("module,craft", [("breakout", few_bricks), ("space_invaders", few_aliens),
                                          ("freeway", near_the_top)])
@pytest.mark.parametrize("ramping", [True, False])
def test_port_plays_minatars_game_from_rare_states(module, craft, ramping):
    mod = f"difficulty_ramping={int(ramping)}"
    ends = play(module, GAMES[module], mod, 0.1, ramping, [10, 11, 12, 13], 800, craft=craft)
    assert ends >= 8


@pytest.mark.parametrize("module", list(GAMES))
def test_port_with_minimal_actions_and_rows_stepped_apart(module):
    """-v1 ids (the game's minimal action set), and rows stepped in changing subsets (the others wait), past the
    end of a block of draws taken ahead."""
    ends = play(module, GAMES[module] + "-v1", "", 0.1, True, [7, 8, 9],
                2 * BLOCK + 100, rows_step=lambda t: np.array([0, 2]) if t % 3 else np.array([1]),
                craft=near_the_top if module == "freeway" else None)  # Freeway: shorter games
    assert ends >= 2


def test_only_minatars_own_games_have_ports():
    assert port_name(MinAtarEnv("MinAtar/Breakout")) == "breakout"
    assert port_name(MinAtarEnv("MinAtar/Seaquest")) is None
    assert port_name(MinAtarEnv("MinAtar/Asterix")) is None


def test_freeway_draws_from_the_game_s_own_random_state_before_a_seeded_reset():
    """Unseeded, MinAtar's Environment and game hold different RandomStates: sticky actions draw from the first, new
    car speeds from the second."""
    core, ref = MinAtarEnv("MinAtar/Freeway"), Environment("freeway")
    core.reset()
    assert core.game.random is not core.game.env.random
    # Fixed states keep the two apart (as unseeded ones are) while making the crossings below reproducible: from OS
    # entropy, sticky actions and fast cars left one crossing in 400 steps now and then.
    core.game.random.seed(11)
    core.game.env.random.seed(12)
    for a, b in ((core.game.random, ref.random), (core.game.env.random, ref.env.random)):
        b.set_state(a.get_state())
    ref.env.cars = [list(c) for c in core.game.env.cars]
    ref.env.pos = core.game.env.pos = 1
    port = PORTS["freeway"](1, 6)
    port.load(0, core)
    obs = np.zeros((1, 7, 10, 10), np.float32)
    crossed = 0
    for t in range(400):
        reward, _ = port.step(np.array([0]), np.array([2]), obs)  # up
        r, _ = ref.act(2)
        crossed += r
        assert reward[0] == r
        np.testing.assert_array_equal(obs[0], ref.state().transpose(2, 0, 1), err_msg=f"step {t}")
    assert crossed >= 2
    port.settle(0)
    for a, b in ((core.game.random, ref.random), (core.game.env.random, ref.env.random)):
        assert a.get_state()[2] == b.get_state()[2] and np.array_equal(a.get_state()[1], b.get_state()[1])
