"""Backends: single environments whose modifications can be switched in place.

Every backend env has `set_modifications(modification: str)`; the change takes effect at the next `reset()`, which the
vector env does right away (see `continual.envs.vector`). Modification strings are validated with
`validate_modification(backend, env_id, s)` before any env is built.

- HackAtari (hackatari 0.0.6 on ocatari 2.2.1), fixed here: terminated/truncated come back in the right order, the
  observation space is the real dtype, hooks run in sorted name order, modification randomness is seeded per env,
  the frame loop stops at game over, and names hackatari 0.0.6 lacks come from `continual.envs.modifications`.
- OCAtari: object-centric observations of the unmodified game (only "" is valid).
- Gymnasium: any registered id. Tokens are `name=value`: ALE games take `mode=`/`difficulty=`; other envs take
  numeric attributes of the unwrapped env (CartPole `gravity`, `length`, ...), with dependent quantities re-derived.
"""

from __future__ import annotations

import ast
import functools
import importlib
import math
import os
import random
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from continual.envs.modifications import registered as registered_modifications
from continual.errors import UserError
from continual.modstrings import modification_tokens, normalize_modification

BACKENDS = ("HackAtari", "OCAtari", "Gymnasium")


def game_name(env_id: str) -> str:
    """'ALE/Freeway-v5' -> 'Freeway'."""
    name = env_id.split("/")[-1].split("-")[0]
    for suffix in ("NoFrameskip", "Deterministic"):
        name = name.replace(suffix, "")
    return name


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def _import_ale() -> None:
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner per env
    gym.register_envs(ale_py)


# --------------------------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def hackatari_native_modifications(game: str) -> tuple[str, ...]:
    """Names in hackatari's own mapping for `game`, read from the module source (0.0.6 cannot list them itself)."""
    try:
        import hackatari.games as games_pkg
    except ImportError:  # pragma: no cover - hackatari is a dependency
        return ()
    path = os.path.join(os.path.dirname(games_pkg.__file__), f"{game.lower()}.py")
    if not os.path.exists(path):
        return ()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_fill_modif_lists":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict):
                    names.update(k.value for k in sub.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return tuple(sorted(names))


def available_modifications(backend: str, env_id: str) -> dict[str, str]:
    """name -> one-line description of every modification valid for (backend, env_id)."""
    if backend == "HackAtari":
        game = game_name(env_id)
        out = {n: "hackatari 0.0.6" for n in hackatari_native_modifications(game)}
        for n, maker in registered_modifications(game).items():
            out[n] = (maker.__doc__ or n).strip().splitlines()[0]
        return dict(sorted(out.items()))
    if backend == "OCAtari":
        return {}
    return {f"{k}=<value>": v for k, v in gym_parameters(env_id).items()}


# Classic-control parameters users can set, with what must be re-derived after a change.
CLASSIC_PARAMETERS: dict[str, dict[str, str]] = {
    "CartPole": {
        "gravity": "m/s^2", "masscart": "kg", "masspole": "kg", "length": "half pole length (m)",
        "force_mag": "push force (N)", "tau": "seconds per step",
    },
    "MountainCar": {"force": "engine force", "gravity": "gravity", "max_speed": "speed limit"},
    "Acrobot": {
        "LINK_LENGTH_1": "m", "LINK_LENGTH_2": "m", "LINK_MASS_1": "kg", "LINK_MASS_2": "kg",
        "LINK_COM_POS_1": "m", "LINK_COM_POS_2": "m", "LINK_MOI": "moment of inertia", "dt": "s",
    },
    "Pendulum": {"g": "gravity", "m": "mass", "l": "length", "max_speed": "speed limit", "max_torque": "torque limit",
                 "dt": "s"},
}


@functools.lru_cache(maxsize=None)
def gym_parameters(env_id: str) -> dict[str, str]:
    """Settable `name=value` tokens for a Gymnasium-backend env id."""
    if is_atari(env_id):
        _import_ale()
        env = gym.make(env_id)
        try:
            ale = env.unwrapped.ale
            modes = ", ".join(map(str, ale.getAvailableModes()))
            diffs = ", ".join(map(str, ale.getAvailableDifficulties()))
        finally:
            env.close()
        return {"mode": f"game mode, one of {modes}", "difficulty": f"difficulty, one of {diffs}"}
    family = env_id.split("/")[-1].split("-")[0]
    if family in CLASSIC_PARAMETERS:
        return dict(CLASSIC_PARAMETERS[family])
    try:
        env = gym.make(env_id)
    except Exception as e:  # unknown ids are reported by validate_env_id
        raise UserError(f"env_id: cannot make {env_id!r}: {e}") from None
    try:
        u = env.unwrapped
        return {k: "number" for k, v in vars(u).items()
                if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    finally:
        env.close()


def validate_env_id(backend: str, env_id: str) -> None:
    if backend not in BACKENDS:
        raise UserError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if is_atari(env_id):
        _import_ale()
    module, _, name = env_id.rpartition(":")
    try:
        if module:  # "package.module:Env-v0" registers its envs on import, as gymnasium.make does
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ModuleNotFoundError) as e:
        raise UserError(f"env_id: unknown environment {env_id!r} ({str(e).splitlines()[0]})") from None
    if backend in ("HackAtari", "OCAtari"):
        from ocatari.core import AVAILABLE_GAMES

        game = game_name(env_id)
        if game[:4] not in [g[:4] for g in AVAILABLE_GAMES]:
            raise UserError(f"env_id: {game} is not supported by OCAtari/HackAtari")


@functools.lru_cache(maxsize=None)
def action_space_of(backend: str, env_id: str) -> Optional[gym.Space]:
    """The action space of a Gymnasium-backend, non-Atari env (built once and closed); None for Atari backends and ids
    (always Discrete) and for ids that cannot be made (validate_env_id reports those)."""
    if backend != "Gymnasium" or is_atari(env_id):
        return None
    try:
        env = gym.make(env_id)
    except Exception:  # noqa: BLE001 - reported by validate_env_id
        return None
    try:
        return env.action_space
    finally:
        env.close()


def validate_action_space(architecture: str, backend: str, env_id: str, her: bool = False) -> None:
    """Discrete and Box actions are supported by PPO/PPO_CBP; IMPALA and HER need Discrete ones."""
    space = action_space_of(backend, env_id)
    if space is None or isinstance(space, gym.spaces.Discrete):
        return
    if not isinstance(space, gym.spaces.Box):
        raise UserError(f"env_id: {env_id} has a {type(space).__name__} action space; supported: Discrete, Box")
    if architecture not in ("PPO", "PPO_CBP"):
        raise UserError(f"architecture: {architecture} needs a discrete action space; {env_id} has continuous "
                        f"(Box) actions: use PPO or PPO_CBP")
    if her:
        raise UserError(f"her: needs a discrete action space; {env_id} has continuous (Box) actions")


def parse_parameter_tokens(env_id: str, modification: str, ale: Any = None) -> dict[str, float]:
    """Parse `name=value` tokens; `ale` (a live ALE interface) avoids building an env to check modes."""
    params = gym_parameters(env_id)
    out: dict[str, float] = {}
    for tok in modification_tokens(modification):
        name, sep, value = tok.partition("=")
        if not sep or name not in params:
            valid = ", ".join(f"{k}=" for k in params) or "(none)"
            raise UserError(f"modification {tok!r} is not valid for {env_id} (Gymnasium backend); valid: {valid}")
        try:
            v = float(value)
        except ValueError:
            raise UserError(f"modification {tok!r}: {value!r} is not a number") from None
        if not math.isfinite(v):
            raise UserError(f"modification {tok!r}: value must be finite")
        if name in out:
            raise UserError(f"modification {modification!r} sets {name} twice")
        out[name] = v
    if is_atari(env_id) and ("mode" in out or "difficulty" in out):
        env = None
        if ale is None:
            _import_ale()
            env = gym.make(env_id)
            ale = env.unwrapped.ale
        try:
            for key, legal in (("mode", ale.getAvailableModes()), ("difficulty", ale.getAvailableDifficulties())):
                if key in out and int(out[key]) not in list(legal):
                    raise UserError(f"modification {key}={out[key]:g} is not valid for {env_id}; valid {key}s: "
                                    f"{', '.join(map(str, legal))}")
        finally:
            if env is not None:
                env.close()
    return out


def validate_modification(backend: str, env_id: str, modification: str) -> None:
    """Raise a one-line UserError naming the bad token and listing the valid names."""
    if backend == "Gymnasium":
        parse_parameter_tokens(env_id, modification)
        return
    if backend == "OCAtari":
        if modification_tokens(modification):
            raise UserError(f"modification {modification!r}: the OCAtari backend runs unmodified games; "
                            f"use --backend HackAtari for modifications")
        return
    valid = available_modifications(backend, env_id)
    for tok in modification_tokens(modification):
        if tok not in valid:
            raise UserError(f"unknown modification {tok!r} for {game_name(env_id)}; valid: {', '.join(valid)}")


# --------------------------------------------------------------------------------------------------------------------
# environments
# --------------------------------------------------------------------------------------------------------------------


def _seed_worker_rngs(seed: Optional[int]) -> None:
    # hackatari's own modifications draw from the process-global `random`/`np.random`
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed % 2**32)


def _make_hackatari_class():
    _import_ale()
    from hackatari.core import HackAtari
    from ocatari.core import init_objects

    class ContinualHackAtari(HackAtari):
        """HackAtari with switchable modifications and the 0.0.6 bugs fixed (see module docstring)."""

        def __init__(self, env_id: str, modification: str = "", obs_mode: str = "dqn", frameskip: int = 4,
                     buffer_window_size: int = 4, render_mode: Optional[str] = None, need_objects: bool = False,
                     **make_kwargs: Any):
            stacks = ["ori"] if obs_mode == "ori" else []  # a fresh list: ocatari's default list is shared
            super().__init__(env_id, modifs=[], obs_mode=obs_mode, mode="ram", hud=False, render_mode=render_mode,
                             frameskip=frameskip, buffer_window_size=buffer_window_size,
                             create_buffer_stacks=stacks, **make_kwargs)
            self.ale = self._ale
            self._atari = self._env.unwrapped
            self._need_objects = need_objects or obs_mode == "obj"
            self.observation_space = _observation_space(obs_mode, self._env.observation_space, buffer_window_size)
            self.modif_rng = np.random.default_rng()
            self._start_state = self._start_screen = self._screen = None
            self.modification = ""
            self._pending: Optional[str] = None
            self.skip_observations = 0  # coming steps whose observation nobody reads (see upcoming_noops)
            self.set_modifications(modification)
            self._apply_pending()

        def set_modifications(self, modification: str) -> None:
            self._pending = normalize_modification(modification)

        def _apply_pending(self) -> None:
            if self._pending is None:
                return
            game = self.game_name.lower()
            ours = registered_modifications(game)
            step, reset, post = [], [], []
            module = None
            for name in modification_tokens(self._pending):  # sorted: a deterministic hook order
                if name in ours:
                    hooks = ours[name](self, self.modif_rng)
                    step += [hooks.step] if hooks.step else []
                    reset += [hooks.reset] if hooks.reset else []
                    post += [hooks.post] if hooks.post else []
                else:
                    module = module or importlib.import_module(f"hackatari.games.{game}")
                    s, r, p = module.modif_funcs(self, [name])
                    step += list(s)
                    reset += list(r)
                    post += list(p)
            self.step_modifs, self.reset_modifs, self.post_detection_modifs = step, reset, post
            self.modification, self._pending = self._pending, None

        def upcoming_noops(self, n: int) -> None:
            """The next n steps are reset no-ops (envs.NoopReset): only the last buffer_window_size of them
            reach the frame stack, so the others skip the frame processing."""
            self.skip_observations = max(0, n - self.buffer_window_size)

        def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
            self.skip_observations = 0
            if seed is not None:
                # OCAtari never seeds its own np_random (used by NoopResetEnv) nor the modification RNGs
                gym.Env.reset(self, seed=seed)
                self.modif_rng = np.random.default_rng(seed)
                _seed_worker_rngs(seed)
                self._pending = self.modification if self._pending is None else self._pending
            self._apply_pending()
            if seed is not None or self._start_state is None:
                self._env.reset(seed=seed, options=options)
                self._start_state = self._ale.cloneState()
                self._start_screen = self._ale.getScreenRGB()
            else:
                # the post-reset emulator state is always the same: restoring it skips ALE's ~60 reset frames
                # (a restore does not redraw the screen, so the saved first frame stands in until the next step)
                self._ale.restoreState(self._start_state)
                self._screen = self._start_screen
            if self._need_objects or self.post_detection_modifs:
                self.objects = init_objects(self.game_name, self.hud, vision=False)
            for f in self.reset_modifs:
                f()
            self._refresh()
            self._reset_buffer()
            return self._observation(), self._atari._get_info()

        def getScreenRGB(self):
            return self._ale.getScreenRGB() if self._screen is None else self._screen

        def step(self, action):
            self._screen = None
            ale, action_id = self._ale, self._atari._action_set[action]
            reward = 0.0
            for _ in range(self._frameskip):
                for f in self.step_modifs:
                    f()
                reward += ale.act(action_id)
                if ale.game_over(with_truncation=True):
                    break
            if self.skip_observations > 0 and not (self._need_objects or self.post_detection_modifs):
                # the emulator and the modification hooks ran; the frame stack is rebuilt by the steps that follow
                self.skip_observations -= 1
            else:
                self._refresh()
                self._fill_buffer()
            terminated = ale.game_over(with_truncation=False)
            truncated = ale.game_truncated()
            return self._observation(), reward, terminated, truncated, self._atari._get_info()

        def _refresh(self) -> None:
            if self._need_objects or self.post_detection_modifs:
                self.detect_objects()
            for f in self.post_detection_modifs:
                f()

        def _observation(self):
            if self.obs_mode == "dqn":
                return np.array(self._state_buffer_dqn)
            if self.obs_mode == "obj":
                return np.array(self._state_buffer_ns, dtype=np.float32)
            return self.getScreenRGB()

    return ContinualHackAtari


def _make_ocatari_class():
    _import_ale()
    from ocatari.core import OCAtari

    class ContinualOCAtari(OCAtari):
        """OCAtari with terminated/truncated in the right order and a truthful observation space."""

        def __init__(self, env_id: str, obs_mode: str = "obj", frameskip: int = 4, buffer_window_size: int = 4,
                     render_mode: Optional[str] = None, **make_kwargs: Any):
            stacks = ["ori"] if obs_mode == "ori" else []
            super().__init__(env_id, mode="ram", hud=False, obs_mode=obs_mode, render_mode=render_mode,
                             buffer_window_size=buffer_window_size, create_buffer_stacks=stacks,
                             frameskip=frameskip, **make_kwargs)
            self.ale = self._ale
            self.observation_space = _observation_space(obs_mode, self._env.observation_space, buffer_window_size)
            self.modification = ""

        def set_modifications(self, modification: str) -> None:
            if modification_tokens(modification):
                raise ValueError("the OCAtari backend has no modifications")

        def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
            if seed is not None:
                gym.Env.reset(self, seed=seed)
            obs, info = super().reset(seed=seed, options=options)
            return self._cast(obs), info

        def step(self, action):
            obs, reward, truncated, terminated, info = super().step(action)  # ocatari returns them swapped
            return self._cast(obs), reward, terminated, truncated, info

        def _cast(self, obs):
            return np.asarray(obs, dtype=self.observation_space.dtype)

    return ContinualOCAtari


def _observation_space(obs_mode: str, declared: gym.spaces.Box, window: int) -> gym.spaces.Box:
    if obs_mode == "dqn":
        return gym.spaces.Box(0, 255, (window, 84, 84), np.uint8)
    if obs_mode == "obj":
        return gym.spaces.Box(-np.inf, np.inf, declared.shape, np.float32)
    return gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)


class ParameterModifier(gym.Wrapper):
    """Gymnasium backend: applies `name=value` tokens to the unwrapped env at the next reset.

    Parameters not named in the string go back to their defaults, so each regime is fully described by its string.
    """

    def __init__(self, env: gym.Env, env_id: str, modification: str = ""):
        super().__init__(env)
        self.env_id = env_id
        self.modification = ""
        self._defaults: dict[str, Any] = {}
        self._pending: Optional[dict[str, float]] = None
        self.set_modifications(modification)

    def set_modifications(self, modification: str) -> None:
        ale = self.env.unwrapped.ale if is_atari(self.env_id) else None
        self._pending = parse_parameter_tokens(self.env_id, modification, ale=ale)
        self.modification = normalize_modification(modification)

    def reset(self, **kwargs):
        if self._pending is not None:
            self._apply(self._pending)
            self._pending = None
        return self.env.reset(**kwargs)

    def _apply(self, params: dict[str, float]) -> None:
        u = self.env.unwrapped
        if is_atari(self.env_id):
            ale = u.ale
            ale.setMode(int(params.get("mode", ale.getAvailableModes()[0])))
            ale.setDifficulty(int(params.get("difficulty", ale.getAvailableDifficulties()[0])))
            return
        for name in set(self._defaults) | set(params):
            if name not in self._defaults:
                self._defaults[name] = getattr(u, name)
            default = self._defaults[name]
            value = params.get(name, default)
            setattr(u, name, type(default)(value) if isinstance(default, int) and float(value).is_integer() else value)
        rederive(u)


def rederive(u: Any) -> None:
    """Recompute quantities that classic-control envs derive from their parameters in __init__."""
    cls = type(u).__name__
    if cls == "CartPoleEnv":
        u.total_mass = u.masspole + u.masscart
        u.polemass_length = u.masspole * u.length
    elif cls == "PendulumEnv":
        high = np.array([1.0, 1.0, u.max_speed], dtype=np.float32)
        u.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        u.action_space = gym.spaces.Box(-u.max_torque, u.max_torque, shape=(1,), dtype=np.float32)
    elif cls == "MountainCarEnv":
        u.low = np.array([u.min_position, -u.max_speed], dtype=np.float32)
        u.high = np.array([u.max_position, u.max_speed], dtype=np.float32)
        u.observation_space = gym.spaces.Box(u.low, u.high, dtype=np.float32)


def make_backend_env(backend: str, env_id: str, modification: str, *, obs_mode: str = "dqn", frameskip: int = 4,
                     buffer_window_size: int = 4, repeat_action_probability: float = 0.25,
                     max_episode_steps: Optional[int] = None, render_mode: Optional[str] = None,
                     need_objects: bool = False) -> gym.Env:
    """One unwrapped-ish backend env (no preprocessing wrappers) with `set_modifications`."""
    if backend in ("HackAtari", "OCAtari"):
        kwargs: dict[str, Any] = {"repeat_action_probability": repeat_action_probability}
        if max_episode_steps is not None:
            kwargs["max_num_frames_per_episode"] = max_episode_steps * frameskip
        if backend == "HackAtari":
            return _make_hackatari_class()(env_id, modification, obs_mode=obs_mode, frameskip=frameskip,
                                           buffer_window_size=buffer_window_size, render_mode=render_mode,
                                           need_objects=need_objects, **kwargs)
        return _make_ocatari_class()(env_id, obs_mode=obs_mode, frameskip=frameskip,
                                     buffer_window_size=buffer_window_size, render_mode=render_mode, **kwargs)
    if is_atari(env_id):
        _import_ale()
        kwargs = {"frameskip": 1, "repeat_action_probability": repeat_action_probability}
        if max_episode_steps is not None:
            kwargs["max_num_frames_per_episode"] = max_episode_steps * frameskip
        env = gym.make(env_id, render_mode=render_mode, **kwargs)
    else:
        kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps is not None else {}
        env = gym.make(env_id, render_mode=render_mode, **kwargs)
    return ParameterModifier(env, env_id, modification)

