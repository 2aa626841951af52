"""Backends: single environments whose modifications can be switched in place.

Every backend env has `set_modifications(modification: str | Task)`; the change takes effect at the next `reset()`,
which the vector env does right away (see `continual.envs.vector`). Each curriculum entry is parsed once into a
`continual.modstrings.Task` and validated with `validate_task(task)` (`validate_modification(backend, env_id, s)` for
one string) before any env is built.

- HackAtari (hackatari 0.0.6 on ocatari 2.2.1), fixed here: terminated/truncated come back in the right order, the
  observation space is the real dtype, hooks run in sorted name order, modification randomness is seeded per env,
  the frame loop stops at game over, and names hackatari 0.0.6 lacks come from `continual.envs.modifications`.
- OCAtari: object-centric observations of the unmodified game (only "" is valid).
- Gymnasium: any registered id. Tokens are `name=value`: ALE games take `mode=`/`difficulty=`; other envs take
  numeric attributes of the unwrapped env (CartPole `gravity`, `length`, ...), with dependent quantities re-derived.
- MiniHack (nle 1.3.0, minihack 1.0.2): `MiniHack-*` ids with CORA's rewards and observations
  (`continual.envs.minihack`); no modifications besides `env=` tokens.
- MinAtar (minatar 1.0.15): `MinAtar/<Game>` (Asterix, Breakout, Freeway, Seaquest, SpaceInvaders), the 10x10xC
  bool grid as float32 channels-first (C, 10, 10), all 6 actions in every game. Tokens `sticky_action_prob=<p>`
  (MinAtar's default 0.1), `difficulty_ramping=0|1` (default 1), and for long non-stationary sequences (loss of
  plasticity) `permute_obs=<K>` / `permute_actions=<K>`: the observation channels / action meanings permuted by a
  fixed permutation drawn from the integer K (0: identity; the same K gives the same permutation in every run).

Task sequences across games: a modification string may carry one `env=<env id>` token (`env=MinAtar/Breakout
sticky_action_prob=0.2`); it names the game of that regime (same backend), the other tokens are its modifications
(`Task.env`). When a run's regimes name several games, their spaces are made one (`task_compat`): ALE games use
the full 18-action set (as CORA) and keep their 4x84x84 frames; MinAtar grids are zero-padded to the largest
channel count; MiniHack tasks get the union of their action sets; other Box observations are zero-padded to the largest shape and Discrete action sets grow to the
largest (an index a task lacks acts as its last action). Anything else is refused before any env is built.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import math
import os
import random
import sys
import types
from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np

from continual.envs import minihack
from continual.envs.modifications import registered as registered_modifications
from continual.errors import UserError
from continual.modstrings import Task, as_task, game_name, own_task, parse_task
from continual.specs import BOX_ACTIONS, SPECS, names_of, supporting

BACKENDS = ("HackAtari", "OCAtari", "Gymnasium", "MinAtar", "MiniHack")


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def likely_backend(env_id: str) -> Optional[str]:
    """The backend an env id belongs to, where its form says so (None: no guess): `MinAtar/<Game>`, `MiniHack-*`,
    `ALE/<Game>-v5` (HackAtari), an id Gymnasium has registered."""
    if env_id.startswith("MinAtar/"):
        return "MinAtar"
    if env_id.startswith("MiniHack-"):
        return "MiniHack"
    if is_atari(env_id):
        return "HackAtari"
    if ":" not in env_id and env_id in gym.registry:
        return "Gymnasium"
    return None


def backend_hint(backend: str, env_id: str) -> str:
    """'; <env id> is a <X> game: add --backend <X>' when the id looks like another backend's, else ''."""
    other = likely_backend(env_id)
    if other is None or other == backend or (other == "HackAtari" and backend == "OCAtari"):
        return ""
    return f"; {env_id!r} looks like a {other} env: add --backend {other}"


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
    if backend in ("OCAtari", "MiniHack"):
        return {}
    if backend == "MinAtar":
        return {f"{k}=<value>": v for k, v in MINATAR_PARAMETERS.items()}
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
    family = game_name(env_id)
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
    if backend in ("MinAtar", "MiniHack"):
        try:
            if backend == "MinAtar":
                minatar_actions(env_id)  # the game and the version
            else:
                minihack.validate_env_id(env_id)
        except UserError as e:
            raise UserError(f"{e}{backend_hint(backend, env_id)}") from None
        return
    if backend in ("HackAtari", "OCAtari") and not is_atari(env_id):
        raise UserError(f"env_id: {backend} needs a full ALE id such as 'ALE/Freeway-v5', got {env_id!r}"
                        f"{backend_hint(backend, env_id)}")
    if is_atari(env_id):
        _import_ale()
    module, _, name = env_id.rpartition(":")
    try:
        if module:  # "package.module:Env-v0" registers its envs on import, as gymnasium.make does
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ModuleNotFoundError) as e:
        raise UserError(f"env_id: unknown environment {env_id!r} ({str(e).splitlines()[0]})"
                        f"{backend_hint(backend, env_id)}") from None
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


def validate_action_space(architecture: str, backend: str, env_id: str, her: bool = False,
                          c_chain: bool = False) -> None:
    """Discrete and Box actions are supported by PPO/PPO_CBP; IMPALA, HER and C-CHAIN need Discrete ones."""
    space = action_space_of(backend, env_id)
    if space is None or isinstance(space, gym.spaces.Discrete):
        return
    if not isinstance(space, gym.spaces.Box):
        raise UserError(f"env_id: {env_id} has a {type(space).__name__} action space; supported: Discrete, Box")
    if not SPECS[architecture].supports(BOX_ACTIONS):
        raise UserError(f"architecture: {architecture} needs a discrete action space; {env_id} has continuous "
                        f"(Box) actions: use {names_of(supporting(BOX_ACTIONS))}")
    if her:
        raise UserError(f"her: needs a discrete action space; {env_id} has continuous (Box) actions")
    if c_chain:
        raise UserError(f"c_chain: PPO's C-CHAIN is the paper's form for discrete actions (a cross-entropy between "
                        f"policies); {env_id} has continuous (Box) actions")


def gym_parameter_values(task: Task, ale: Any = None) -> dict[str, float]:
    """A Gymnasium-backend task's `name=value` parameters as numbers; `ale` (a live ALE interface) avoids building an
    env to check modes."""
    env_id = task.env_id
    params = gym_parameters(env_id)
    out: dict[str, float] = {}
    for tok, (name, value) in zip(task.tokens, task.parameters):
        if value is None or name not in params:
            valid = ", ".join(f"{k}=" for k in params) or "(none)"
            raise UserError(f"modification {tok!r} is not valid for {env_id} (Gymnasium backend); valid: {valid}")
        try:
            v = float(value)
        except ValueError:
            raise UserError(f"modification {tok!r}: {value!r} is not a number") from None
        if not math.isfinite(v):
            raise UserError(f"modification {tok!r}: value must be finite")
        if name in out:
            raise UserError(f"modification {task.quoted!r} sets {name} twice")
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


def validate_task(task: Task) -> None:
    """Raise a one-line UserError naming the bad token and listing the valid names. An `env=` token (a task of
    another game) is checked as an env id of the task's backend, the other tokens against that game."""
    backend = task.backend
    if task.env is not None:
        validate_env_id(backend, task.env)
    if backend == "MinAtar":
        minatar_parameters(task)
        return
    if backend == "MiniHack":
        minihack.validate_task(task)
        return
    if backend == "Gymnasium":
        gym_parameter_values(task)
        return
    if backend == "OCAtari":
        if task.tokens:
            raise UserError(f"modification {task.quoted!r}: the OCAtari backend runs unmodified games; "
                            f"use --backend HackAtari for modifications")
        return
    valid = available_modifications(backend, task.env_id)
    for tok in task.tokens:
        if tok not in valid:
            raise UserError(f"unknown modification {tok!r} for {task.game}; valid: {', '.join(valid)}")


def validate_modification(backend: str, env_id: str, modification: str) -> None:
    """`validate_task` of one string, for a run of `backend` on `env_id`."""
    validate_task(parse_task(modification, backend, env_id))


# --------------------------------------------------------------------------------------------------------------------
# MinAtar
# --------------------------------------------------------------------------------------------------------------------

MINATAR_GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway", "Seaquest": "seaquest",
                 "SpaceInvaders": "space_invaders"}
MINATAR_PARAMETERS = {
    "sticky_action_prob": "probability that the previous action is repeated, in [0, 1] (MinAtar's default 0.1)",
    "difficulty_ramping": "1: the game speeds up as it goes on (MinAtar's default), 0: it does not",
    "permute_obs": "integer K >= 0: observation channel c shows the game's channel perm_K[c], perm_K a fixed "
                   "permutation drawn from K (0: identity)",
    "permute_actions": "integer K >= 0: action a plays the game's action perm_K[a], perm_K a fixed permutation drawn "
                       "from K (0: identity)",
    "no_reward_cutoff": "integer N >= 0: an episode still without reward (return < 0.1) after N steps is cut there, a "
                        "truncation (0: never; C-CHAIN's Continual MinAtar cuts Seaquest at 1000)",
}
MINATAR_DEFAULTS = {"sticky_action_prob": 0.1, "difficulty_ramping": 1.0, "permute_obs": 0.0, "permute_actions": 0.0,
                    "no_reward_cutoff": 0.0}
MINATAR_PERMUTATIONS = ("permute_obs", "permute_actions")
MINATAR_NUM_ACTIONS = 6  # MinAtar's full action set, the same in every game


def minatar_module(env_id: str) -> str:
    """'MinAtar/Breakout' (or the gymnasium ids 'MinAtar/Breakout-v0'/'-v1') -> 'breakout'."""
    prefix, game = env_id.partition("/")[0], game_name(env_id)
    if prefix != "MinAtar" or game not in MINATAR_GAMES:
        raise UserError(f"env_id: the MinAtar backend runs MinAtar/<Game> with Game one of "
                        f"{', '.join(MINATAR_GAMES)}, got {env_id!r}")
    return MINATAR_GAMES[game]


class _OnFirstUse(types.ModuleType):
    """Stands for a module that is imported on its first attribute access (see `import_minatar`)."""

    def __getattr__(self, attr: str):
        real = self.__dict__.get("_real")
        if real is None:
            real = self.__dict__["_real"] = importlib.import_module(self.__name__)
        return getattr(real, attr)


def import_minatar() -> types.ModuleType:
    """The `minatar` package. Its `environment` module imports seaborn and pyplot for `display_state` (~2 s a
    process, scipy.stats under seaborn, in every training run, actor and evaluator): while minatar imports, the ones
    not imported yet are stand-ins that import them on first use, removed from sys.modules right after, so nothing
    else ever sees them."""
    if "minatar" in sys.modules:
        return sys.modules["minatar"]
    import matplotlib  # minatar imports matplotlib.colors: cheap

    standins = {name: _OnFirstUse(name) for name in ("seaborn", "matplotlib.pyplot") if name not in sys.modules}
    sys.modules.update(standins)
    if "matplotlib.pyplot" in standins:
        matplotlib.pyplot = standins["matplotlib.pyplot"]
    try:
        return importlib.import_module("minatar")
    finally:
        for name, module in standins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        if getattr(matplotlib, "pyplot", None) is standins.get("matplotlib.pyplot"):
            del matplotlib.pyplot


@functools.lru_cache(maxsize=None)
def minatar_actions(env_id: str) -> tuple[int, ...]:
    """The MinAtar actions an env id's action indices stand for: all 6, or the game's minimal set for a `-v1` id."""
    version = env_id.partition("/")[2].partition("-")[2]
    if version in ("", "v0"):
        return tuple(range(MINATAR_NUM_ACTIONS))
    if version != "v1":
        raise UserError(f"env_id {env_id!r}: MinAtar ids are MinAtar/<Game> or -v0 (all 6 actions) or -v1 (the "
                        f"game's minimal action set)")
    import_minatar()
    env = importlib.import_module(f"minatar.environments.{minatar_module(env_id)}").Env(ramping=True)
    return tuple(int(a) for a in env.minimal_action_set())


def minatar_parameters(task: Task) -> dict[str, float]:
    """A MinAtar task's `name=value` parameters over MINATAR_DEFAULTS (names not given keep their defaults)."""
    env_id = task.env_id
    minatar_module(env_id)
    out = dict(MINATAR_DEFAULTS)
    seen: set[str] = set()
    for tok, (name, value) in zip(task.tokens, task.parameters):
        if value is None or name not in MINATAR_PARAMETERS:
            raise UserError(f"modification {tok!r} is not valid for {env_id} (MinAtar backend); valid: "
                            f"{', '.join(f'{k}=' for k in MINATAR_PARAMETERS)}")
        try:
            v = float(value)
        except ValueError:
            raise UserError(f"modification {tok!r}: {value!r} is not a number") from None
        if name in seen:
            raise UserError(f"modification {task.quoted!r} sets {name} twice")
        if name == "sticky_action_prob" and not 0.0 <= v <= 1.0:
            raise UserError(f"modification {tok!r}: a probability in [0, 1]")
        if name == "difficulty_ramping" and v not in (0.0, 1.0):
            raise UserError(f"modification {tok!r}: 0 or 1")
        if name in MINATAR_PERMUTATIONS and not (0 <= v < 2**32 and v == int(v)):
            raise UserError(f"modification {tok!r}: an integer K >= 0 (0: no permutation)")
        if name == "no_reward_cutoff" and not (0 <= v < 2**63 and v == int(v)):
            raise UserError(f"modification {tok!r}: an integer N >= 0 (0: never)")
        seen.add(name)
        out[name] = v
    return out


def minatar_permutation(k: int, n: int) -> Optional[np.ndarray]:
    """The fixed permutation of n items that `permute_obs=k` / `permute_actions=k` name: None (identity) for k = 0,
    else numpy's permutation from seed k, drawn again until it moves something (a regime must differ from K=0)."""
    if k == 0 or n < 2:
        return None
    rng = np.random.default_rng(k)
    while True:
        perm = rng.permutation(n)
        if (perm != np.arange(n)).any():
            return perm


class MinAtarEnv(gym.Env):
    """A MinAtar game as a gymnasium env with switchable parameters (applied at the next reset).

    Observation: the (10, 10, C) bool grid as float32 (C, 10, 10). Actions: MinAtar's 6 (n, l, u, r, d, f) in every
    game, or with a `-v1` id (`MinAtar/Breakout-v1`, as MinAtar's own gymnasium registration and gymnax) the game's
    minimal action set (Breakout: n, l, r). Seeded resets seed MinAtar's own RandomState (sticky actions and the
    game's randomness). `permute_obs`/`permute_actions` reorder the channels the agent sees and the actions it
    plays (`act` and `write_obs`, so the batched vector env gets them too); `render` shows the game unpermuted.
    `no_reward_cutoff=N` truncates an episode whose return is still below 0.1 after N steps (`step`; the batched
    vector env does the same from `cutoff`), as C-CHAIN's Continual MinAtar does with Seaquest, whose episodes a
    policy that never dives need not end."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, env_id: str, modification: str | Task = "", render_mode: Optional[str] = None):
        Environment = import_minatar().Environment

        self.env_id = env_id
        self.render_mode = render_mode
        self._module = minatar_module(env_id)
        task = own_task(modification, "MinAtar", env_id)
        self._params = minatar_parameters(task)
        self.game = Environment(self._module, sticky_action_prob=self._params["sticky_action_prob"],
                                difficulty_ramping=bool(self._params["difficulty_ramping"]))
        h, w, c = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0.0, 1.0, (c, h, w), np.float32)
        self.actions = minatar_actions(env_id)
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self.modification = task.modification
        self._pending: Optional[dict[str, float]] = None
        self._set_permutations(self._params)
        self._length, self._return = 0, 0.0

    def set_modifications(self, modification: str | Task) -> None:
        task = own_task(modification, "MinAtar", self.env_id)
        self._pending = minatar_parameters(task)
        self.modification = task.modification

    def _apply_pending(self) -> None:
        if self._pending is None:
            return
        params, self._pending = self._pending, None
        self.game.sticky_action_prob = params["sticky_action_prob"]
        if params["difficulty_ramping"] != self._params["difficulty_ramping"]:
            # ramping is fixed when MinAtar builds the game: a new game object that draws from the same RandomState
            self.game.env = importlib.import_module(f"minatar.environments.{self._module}").Env(
                ramping=bool(params["difficulty_ramping"]))
            self.game.env.random = self.game.random
        self._set_permutations(params)
        self._params = params

    @property
    def cutoff(self) -> int:
        """`no_reward_cutoff` of the regime playing now (0: none)."""
        return int(self._params["no_reward_cutoff"])

    def _set_permutations(self, params: dict[str, float]) -> None:
        """`_game_actions[a]`: the MinAtar action that index a plays; `_channels`: the game channel each observation
        channel shows (None: identity, the fast path)."""
        perm = minatar_permutation(int(params["permute_actions"]), len(self.actions))
        self._game_actions = self.actions if perm is None else tuple(self.actions[p] for p in perm)
        self._channels = minatar_permutation(int(params["permute_obs"]), self.observation_space.shape[0])

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self._apply_pending()
        if seed is not None:
            self.game.seed(seed)
        self.game.reset()
        self.game.last_action = 0
        self._length, self._return = 0, 0.0
        return self._obs(), {}

    def step(self, action):
        reward, done = self.act(int(action))
        self._length += 1
        self._return += reward
        cut = self.cutoff
        truncated = bool(cut and not done and self._length >= cut and self._return < 0.1)
        return self._obs(), reward, done, truncated, {}

    def act(self, action: int) -> tuple[float, bool]:
        """(reward, terminated) of one step (`continual.envs.batched` steps the game through this, not `step`)."""
        reward, done = self.game.act(self._game_actions[action])
        return float(reward), bool(done)

    def _state(self) -> np.ndarray:
        """The game's (10, 10, C) grid with the channels this regime shows, in their order."""
        state = self.game.state()
        return state if self._channels is None else state[..., self._channels]

    def write_obs(self, out: np.ndarray) -> None:
        """The observation into `out`'s first C channels (a padded row of a batch keeps its zero channels)."""
        out[:self.observation_space.shape[0]] = self._state().transpose(2, 0, 1)

    def _obs(self) -> np.ndarray:
        return np.ascontiguousarray(self._state().transpose(2, 0, 1), dtype=np.float32)

    def render(self):
        # each channel its own colour on black, 16 pixels per cell
        state = self.game.state()
        c = state.shape[-1]
        hues = np.linspace(0.0, 1.0, c, endpoint=False)
        palette = np.stack([0.5 + 0.5 * np.cos(2 * np.pi * (hues + k / 3)) for k in range(3)], axis=1)
        palette = np.concatenate([np.zeros((1, 3)), palette]) * 255
        index = np.where(state.any(-1), state.argmax(-1) + 1, 0)
        return np.kron(palette[index], np.ones((16, 16, 1))).astype(np.uint8)


# --------------------------------------------------------------------------------------------------------------------
# task sequences: one observation and action space for every game of a run
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskCompat:
    """How a run's games share spaces: `obs_shape` (zero-pad observations to it), `num_actions` (a Discrete action
    set of that size), `full_action_space` (ALE's 18 actions). All None/False for a one-game run: nothing changes."""

    obs_shape: Optional[tuple[int, ...]] = None
    num_actions: Optional[int] = None
    full_action_space: bool = False
    actions: tuple[int, ...] = ()  # MiniHack: the union of the tasks' action sets (NetHack command codes)


@functools.lru_cache(maxsize=None)
def task_compat(backend: str, env_ids: tuple[str, ...], obs_mode: str = "dqn") -> TaskCompat:
    """The common spaces of `env_ids` under `backend`, or a one-line UserError naming why there are none."""
    if len(set(env_ids)) <= 1:
        return TaskCompat()
    names = ", ".join(env_ids)
    atari = [is_atari(e) for e in env_ids]
    if backend in ("HackAtari", "OCAtari") or any(atari):
        if not all(atari):
            raise UserError(f"task sequence: ALE and non-ALE games cannot share one agent ({names})")
        if obs_mode != "dqn":
            raise UserError(f"task sequence: obs_mode {obs_mode!r} differs between games ({names}); a sequence "
                            f"of several Atari games needs obs_mode dqn (4x84x84 frames)")
        return TaskCompat(full_action_space=True)
    if backend == "MiniHack":  # one crop size for every task: only the action sets differ
        return TaskCompat(actions=minihack.union_actions(env_ids))
    if backend == "MinAtar":
        shapes = [MinAtarEnv(e).observation_space.shape for e in env_ids]
        return TaskCompat(obs_shape=(max(s[0] for s in shapes), *shapes[0][1:]),
                          num_actions=max(len(minatar_actions(e)) for e in env_ids))
    spaces = []
    for e in env_ids:
        env = gym.make(e)
        spaces.append((e, env.observation_space, env.action_space))
        env.close()
    obs = [s for _, s, _ in spaces]
    acts = [a for _, _, a in spaces]
    if not all(isinstance(o, gym.spaces.Box) for o in obs) or len({o.shape.__len__() for o in obs}) != 1:
        shown = "; ".join(f"{e}: {o}" for e, o, _ in spaces)
        raise UserError(f"task sequence: observations cannot be padded to one shape (Box spaces of one rank "
                        f"needed): {shown}")
    obs_shape = tuple(max(o.shape[i] for o in obs) for i in range(len(obs[0].shape)))
    if all(isinstance(a, gym.spaces.Discrete) for a in acts):
        return TaskCompat(obs_shape=obs_shape, num_actions=max(int(a.n) for a in acts))
    if all(isinstance(a, gym.spaces.Box) for a in acts) and len({a.shape for a in acts}) == 1:
        return TaskCompat(obs_shape=obs_shape)
    shown = "; ".join(f"{e}: {a}" for e, _, a in spaces)
    raise UserError(f"task sequence: action spaces cannot be made one (all Discrete, or Box of one shape): {shown}")


class PadTask(gym.Wrapper):
    """A task's spaces made the sequence's (`TaskCompat`): observations zero-padded to `obs_shape` (at the end of
    each axis), Discrete actions widened to `num_actions` (an index this task lacks acts as its last action)."""

    def __init__(self, env: gym.Env, obs_shape: Optional[tuple[int, ...]], num_actions: Optional[int]):
        super().__init__(env)
        space = env.observation_space
        self._pad = None
        if obs_shape is not None and tuple(space.shape) != tuple(obs_shape):
            self._pad = [(0, t - s) for s, t in zip(space.shape, obs_shape)]
            low = np.pad(np.broadcast_to(space.low, space.shape), self._pad)
            high = np.pad(np.broadcast_to(space.high, space.shape), self._pad)
            self.observation_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self._n = None
        if num_actions is not None and isinstance(env.action_space, gym.spaces.Discrete):
            self._n = int(env.action_space.n)
            self.action_space = gym.spaces.Discrete(num_actions)

    def _obs(self, obs):
        return obs if self._pad is None else np.pad(obs, self._pad)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._obs(obs), info

    def step(self, action):
        if self._n is not None:
            action = min(int(action), self._n - 1)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._obs(obs), reward, terminated, truncated, info


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

        def __init__(self, env_id: str, modification: str | Task = "", obs_mode: str = "dqn", frameskip: int = 4,
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
            self.env_id = env_id
            self.modification = ""
            self._task = self._pending = None
            self.skip_observations = 0  # coming steps whose observation nobody reads (see upcoming_noops)
            self.set_modifications(modification)
            self._apply_pending()

        def set_modifications(self, modification: str | Task) -> None:
            self._pending = own_task(modification, "HackAtari", self.env_id)

        def _apply_pending(self) -> None:
            if self._pending is None:
                return
            game = self.game_name.lower()
            ours = registered_modifications(game)
            step, reset, post = [], [], []
            module = None
            for name in self._pending.tokens:  # sorted: a deterministic hook order
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
            self._task, self._pending = self._pending, None
            self.modification = self._task.modification

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
                self._pending = self._task if self._pending is None else self._pending
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
            self.env_id = env_id
            self.modification = ""

        def set_modifications(self, modification: str | Task) -> None:
            if own_task(modification, "OCAtari", self.env_id).tokens:
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

    def __init__(self, env: gym.Env, env_id: str, modification: str | Task = ""):
        super().__init__(env)
        self.env_id = env_id
        self.modification = ""
        self._defaults: dict[str, Any] = {}
        self._pending: Optional[dict[str, float]] = None
        self.set_modifications(modification)

    def set_modifications(self, modification: str | Task) -> None:
        ale = self.env.unwrapped.ale if is_atari(self.env_id) else None
        task = own_task(modification, "Gymnasium", self.env_id)
        self._pending = gym_parameter_values(task, ale=ale)
        self.modification = task.modification

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


def make_backend_env(backend: str, env_id: str, modification: str | Task, *, obs_mode: str = "dqn",
                     frameskip: int = 4,
                     buffer_window_size: int = 4, repeat_action_probability: float = 0.25,
                     max_episode_steps: Optional[int] = None, render_mode: Optional[str] = None,
                     need_objects: bool = False, full_action_space: bool = False,
                     actions: Sequence[int] = ()) -> gym.Env:
    """One unwrapped-ish backend env (no preprocessing wrappers) with `set_modifications`. An `env=` token in
    `modification` replaces `env_id`; `full_action_space`: ALE's 18 actions (a sequence of several games);
    `actions`: MiniHack's action set of a sequence (`TaskCompat.actions`)."""
    modification = as_task(modification, backend, env_id)
    env_id = modification.env_id
    if backend == "MiniHack":
        env = minihack.MiniHackEnv(env_id, modification, obs_mode=obs_mode, actions=actions or None,
                                   render_mode=render_mode)
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env
    if backend == "MinAtar":
        env = MinAtarEnv(env_id, modification, render_mode=render_mode)
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env
    if backend in ("HackAtari", "OCAtari"):
        kwargs: dict[str, Any] = {"repeat_action_probability": repeat_action_probability}
        if full_action_space:
            kwargs["full_action_space"] = True
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
        kwargs = {"frameskip": 1, "repeat_action_probability": repeat_action_probability,
                  "full_action_space": full_action_space}
        if max_episode_steps is not None:
            kwargs["max_num_frames_per_episode"] = max_episode_steps * frameskip
        env = gym.make(env_id, render_mode=render_mode, **kwargs)
    else:
        kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps is not None else {}
        env = gym.make(env_id, render_mode=render_mode, **kwargs)
    return ParameterModifier(env, env_id, modification)

