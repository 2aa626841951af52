"""Freeway modifications missing from hackatari 0.0.6 (RAM semantics of HackAtari's later revisions).

RAM map: 1 frame counter; 14 player chicken y; 33-42 per-lane car speed/move timer (100 = stopped);
77-86 car colours; 108-117 car x positions (lanes 0-4 move right, 5-9 move left).
"""

from __future__ import annotations

from continual.envs.modifications.registry import Hooks, modification

FRAME_COUNTER = 1
CAR_SPEED = range(33, 43)
CAR_COLOUR = range(77, 87)
CAR_X = range(108, 118)
PINK, BLACK, INVISIBLE = 90, 0, 6  # INVISIBLE is the road colour
PALETTE = (0, 2, 66, 15, 210, 120, 145, 6)


def _set_all(env, addresses, value: int) -> None:
    for a in addresses:
        env.set_ram(a, value)


@modification("Freeway", "disable_cars")
def disable_cars(env, rng):
    """All cars stopped and moved off-screen (x = 3)."""

    def step():
        _set_all(env, CAR_SPEED, 100)
        _set_all(env, CAR_X, 3)

    return Hooks(step=step)


@modification("Freeway", "stop_random_car_develop")
def stop_random_car_develop(env, rng):
    """HackAtari's stop_random_car from April 2025 on (the revisions the seed project evaluated with): every step one
    random car's speed byte is set to 8 with p = 0.9, else 0; hackatari 0.0.6's stop_random_car sets 100 (stopped)."""

    def step():
        value = 8 if rng.random() >= 0.1 else 0  # HackAtari: random.choices([0, 1, 2, 3], weights=[.1, .3, .3, .3])
        env.set_ram(int(rng.integers(CAR_SPEED.start, CAR_SPEED.stop)), value)

    return Hooks(step=step)


@modification("Freeway", "stop_all_cars_edge")
def stop_all_cars_edge(env, rng):
    """All cars stopped at the screen edges (x = 15 for the right-moving lanes, 150 for the others)."""

    def step():
        _set_all(env, CAR_SPEED, 100)
        _set_all(env, CAR_X[:5], 15)
        _set_all(env, CAR_X[5:], 150)

    return Hooks(step=step)


@modification("Freeway", "stop_all_cars_tunnel")
def stop_all_cars_tunnel(env, rng):
    """All cars stopped in a 'tunnel' near the middle (x = 35 / 55)."""

    def step():
        _set_all(env, CAR_SPEED, 100)
        _set_all(env, CAR_X[:5], 35)
        _set_all(env, CAR_X[5:], 55)

    return Hooks(step=step)


def _reverse(lanes):
    def make(env, rng):
        def step():
            frame = int(env.get_ram()[FRAME_COUNTER])
            for i, a in enumerate(lanes):
                env.set_ram(a, frame % (i + 1))

        return Hooks(step=step)

    return make


_REVERSE_DOC = "lane i of the {} five lanes moves on frames where frame % (i+1) == 0: the fast lanes become slow"
modification("Freeway", "reverse_car_speed_top", _REVERSE_DOC.format("top"))(_reverse([42, 41, 40, 39, 38]))
modification("Freeway", "reverse_car_speed_bottom", _REVERSE_DOC.format("bottom"))(_reverse([33, 34, 35, 36, 37]))


modification("Freeway", "vary_car_speeds_fixed",
             "HackAtari's vary_car_speeds from August 2025 to January 2026 (924dad2..ce3349e), whose per-episode draw "
             "was never called: car i moves on frames where frame % (i+1) == 0, in every episode")(
    _reverse(list(CAR_SPEED)))


@modification("Freeway", "vary_car_speeds")
def vary_car_speeds(env, rng):
    """Each episode draws a speed k in 0..10 per car; a car moves on frames where frame % (k+1) == 0."""
    ks = rng.integers(0, 11, size=10)

    def reset():
        ks[:] = rng.integers(0, 11, size=10)

    def step():
        frame = int(env.get_ram()[FRAME_COUNTER])
        for k, a in zip(ks, CAR_SPEED):
            env.set_ram(a, frame % (int(k) + 1))

    return Hooks(step=step, reset=reset)


@modification("Freeway", "speed_mode")
def speed_mode(env, rng):
    """Cars move 2 extra pixels per frame in their direction."""

    def step():
        ram = env.get_ram()
        for a in CAR_X[:5]:
            env.set_ram(a, (int(ram[a]) + 2) % 256)
        for a in CAR_X[5:]:
            env.set_ram(a, (int(ram[a]) - 2) % 256)

    return Hooks(step=step)


@modification("Freeway", "all_pink_cars")
def all_pink_cars(env, rng):
    """All cars pink."""
    return Hooks(step=lambda: _set_all(env, CAR_COLOUR, PINK))


@modification("Freeway", "invisible_mode")
def invisible_mode(env, rng):
    """Cars drawn in the road colour (invisible, still deadly)."""
    return Hooks(step=lambda: _set_all(env, CAR_COLOUR, INVISIBLE))


@modification("Freeway", "strobo_mode")
def strobo_mode(env, rng):
    """Every car gets a random colour every frame."""

    def step():
        for a, c in zip(CAR_COLOUR, rng.integers(0, 256, size=10)):
            env.set_ram(a, int(c))

    return Hooks(step=step)


def _every_30_frames(choose):
    def make(env, rng):
        state = {"frame": 0, "colour": int(choose(rng, 0))}

        def step():
            if state["frame"] % 30 == 0:
                state["colour"] = int(choose(rng, state["frame"] // 30))
            state["frame"] += 1
            _set_all(env, CAR_COLOUR, state["colour"])

        def reset():
            state["frame"] = 0

        return Hooks(step=step, reset=reset)

    return make


modification("Freeway", "phantom_mode", "cars alternate black / invisible every 30 frames")(
    _every_30_frames(lambda rng, k: BLACK if k % 2 == 0 else INVISIBLE)
)
modification("Freeway", "blinking_mode", "all cars switch to a random palette colour every 30 frames")(
    _every_30_frames(lambda rng, k: rng.choice(PALETTE))
)
