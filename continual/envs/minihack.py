"""The MiniHack backend (nle 1.3.0, minihack 1.0.2): NetHack-based tasks as CORA runs them.

`--backend MiniHack --env_id MiniHack-Room-Random-5x5-v0` (any registered `MiniHack-*` id). Every env is made with
CORA's settings (`continual_rl/experiments/tasks/make_minihack_task.py`): reward 1 for a win, 0 for a loss, -0.001 for
every step that does not advance the game clock (MiniHack's "frozen" steps, such as walking into a wall:
`penalty_mode="constant"`), no time penalty, the character `mon-hum-neu-mal`, each task's own episode limit,
and no ttyrec recordings (`savedir=None`): NLE writes nothing but its per-env temporary folder, which `close()`
removes.

Observations (`--obs_mode`):
- `pixel_crop` (the default on this backend; `dqn` means it): MiniHack's agent-centred 9x9-tile crop at 16 px a
  tile (144x144x3), zero-padded by 2 px a side and resized to 84x84 with INTER_AREA as CORA does, as a channels-first
  (3, 84, 84) uint8 image (the Nature CNN's input).
- `glyphs_crop`: the 9x9 glyph ids around the agent as a (C, 9, 9) float32 one-hot over a compact vocabulary (one
  channel per dungeon-map symbol: floor, walls, doors, stairs, lava, water, traps, ...; one per other glyph kind:
  monster, pet, object, corpse, statue, ...; see `GLYPH_CLASSES`), for fast MLP/CNN agents (the small grid CNN).

Actions: each task's own MiniHack action set; when a run's tasks name several env ids (a task sequence, held-out
evaluation tasks), every env is made with the union of their action sets (`union_actions`, in NLE's order of
all actions; held-out `--eval_modifs` tasks included), so the same index is the same NetHack command in every task.

Modifications: none besides the `env=<id>` token of task sequences (`continual.modstrings.Task`); a task
switch swaps the worker's env stack for the other id's, in the same process, as for MinAtar games.

nle/minihack are installed by `.ci/run` (`pip install --no-deps nle==1.3.0 minihack==1.0.2`: nle pins gymnasium
1.2.0, which the project's gymnasium is newer than). minihack imports `pkg_resources`, which setuptools >= 81 no
longer has: `import_minihack` provides the one function it uses when it is missing.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from typing import Optional, Sequence

import gymnasium as gym
import numpy as np

from continual.errors import UserError
from continual.modstrings import Task, own_task

OBS_MODES = ("pixel_crop", "glyphs_crop")
# CORA's env kwargs (make_minihack_task.py); savedir=None: no ttyrecs, no nle_data folder
CORA_KWARGS = {"reward_win": 1, "reward_lose": 0, "penalty_time": 0.0, "penalty_step": -0.001,
               "penalty_mode": "constant", "character": "mon-hum-neu-mal", "savedir": None}
PIXEL_PAD = 2  # CORA pads the 144x144 crop by 2 px a side before resizing to 84x84
INSTALL = "pip install --no-deps nle==1.3.0 minihack==1.0.2"


def _pkg_resources_shim() -> types.ModuleType:
    """The one `pkg_resources` function minihack 1.0.2 calls (setuptools >= 81 dropped the module)."""
    module = types.ModuleType("pkg_resources")

    def resource_filename(package: str, name: str) -> str:
        return os.path.join(os.path.dirname(importlib.import_module(package).__file__), name)

    module.resource_filename = resource_filename
    return module


@functools.lru_cache(maxsize=None)
def import_minihack() -> types.ModuleType:
    """Import nle and minihack (registering the MiniHack-* ids); a missing or broken install is one UserError that
    names the package."""
    shim = None
    try:
        importlib.import_module("pkg_resources")
    except ImportError:
        # only while minihack imports (it calls resource_filename at import time): other code probing for
        # pkg_resources later (setuptools' namespace-package helpers) must not find a partial module
        shim = sys.modules.setdefault("pkg_resources", _pkg_resources_shim())
    try:
        for package in ("nle", "minihack"):
            try:
                module = importlib.import_module(package)
            except Exception as e:  # noqa: BLE001 - an ImportError, or a broken build failing at import
                detail = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise UserError(f"backend MiniHack: the package {package!r} cannot be imported ({detail}); install "
                                f"it with: {INSTALL}") from None
    finally:
        if shim is not None and sys.modules.get("pkg_resources") is shim:
            del sys.modules["pkg_resources"]
    return module


def validate_env_id(env_id: str) -> None:
    import_minihack()
    if not env_id.startswith("MiniHack-"):
        raise UserError(f"env_id: the MiniHack backend runs MiniHack-* ids such as 'MiniHack-Room-Random-5x5-v0', "
                        f"got {env_id!r}")
    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        raise UserError(f"env_id: unknown environment {env_id!r} ({str(e).splitlines()[0]})") from None


def validate_task(task: Task) -> None:
    validate_env_id(task.env_id)
    if task.tokens:
        raise UserError(f"modification {task.tokens[0]!r} is not valid for {task.env_id} (MiniHack backend): its tasks "
                        f"are env ids (env=MiniHack-...), it has no name=value modifications")


def validate_obs_mode(backend: str, obs_mode: str) -> None:
    """pixel_crop/glyphs_crop are MiniHack's, and MiniHack has no object or raw-frame mode."""
    if backend == "MiniHack" and obs_mode not in (*OBS_MODES, "dqn"):
        raise UserError(f"obs_mode: the MiniHack backend observes {' or '.join(OBS_MODES)}, not {obs_mode!r}")
    if backend != "MiniHack" and obs_mode in OBS_MODES:
        raise UserError(f"obs_mode: {obs_mode} is a MiniHack observation; the {backend} backend takes dqn, obj "
                        f"or ori")


def _make(env_id: str, observation_keys: Sequence[str], actions: Optional[Sequence[int]] = None) -> gym.Env:
    import_minihack()
    kwargs = dict(CORA_KWARGS)
    if actions:  # NLE's own action enums (MiniHack compares against them)
        from nle import nethack

        members = {int(a): a for a in nethack.ACTIONS}
        kwargs["actions"] = tuple(members[int(a)] for a in actions)
    return gym.make(env_id, observation_keys=tuple(observation_keys), disable_env_checker=True, **kwargs)


@functools.lru_cache(maxsize=None)
def task_actions(env_id: str) -> tuple[int, ...]:
    """A task's own MiniHack action set (NetHack command codes), read from one env made and closed here."""
    env = _make(env_id, ("glyphs_crop",))
    try:
        return tuple(int(a) for a in env.unwrapped.actions)
    finally:
        env.close()


def union_actions(env_ids: Sequence[str]) -> tuple[int, ...]:
    """The action set every task of a run gets: the union of theirs, in NLE's order of all actions (the 8 compass
    moves first), so that the same set is always the same order, whichever tasks it came from."""
    from nle import nethack

    order = {int(a): i for i, a in enumerate(nethack.ACTIONS)}
    return tuple(sorted({a for env_id in env_ids for a in task_actions(env_id)}, key=order.__getitem__))


@functools.lru_cache(maxsize=None)
def glyph_classes() -> tuple[np.ndarray, tuple[str, ...]]:
    """(channel of every glyph id, channel names): one channel per dungeon-map (cmap) symbol, one per other glyph
    kind (NLE's glyph ranges, MAX_GLYPH 5976 in nle 1.3.0)."""
    import_minihack()
    from nle import nethack

    kinds = [("monster", "GLYPH_MON_OFF"), ("pet", "GLYPH_PET_OFF"), ("invisible", "GLYPH_INVIS_OFF"),
             ("detected", "GLYPH_DETECT_OFF"), ("corpse", "GLYPH_BODY_OFF"), ("ridden", "GLYPH_RIDDEN_OFF"),
             ("object", "GLYPH_OBJ_OFF"), ("cmap", "GLYPH_CMAP_OFF"), ("explosion", "GLYPH_EXPLODE_OFF"),
             ("zap", "GLYPH_ZAP_OFF"), ("swallow", "GLYPH_SWALLOW_OFF"), ("warning", "GLYPH_WARNING_OFF"),
             ("statue", "GLYPH_STATUE_OFF")]
    offsets = sorted((getattr(nethack, attr), name) for name, attr in kinds)
    table = np.zeros(nethack.MAX_GLYPH + 1, dtype=np.int64)  # MAX_GLYPH: NLE's "no glyph", an empty channel
    names: list[str] = []
    bounds = [o for o, _ in offsets] + [nethack.MAX_GLYPH]
    for (start, name), end in zip(offsets, bounds[1:]):
        if name == "cmap":  # each map symbol its own channel: walls, floor, doors, stairs, lava, water, traps
            table[start:end] = len(names) + np.arange(end - start)
            names += [f"cmap{i}" for i in range(end - start)]
        else:
            table[start:end] = len(names)
            names.append(name)
    table[nethack.MAX_GLYPH] = len(names)
    names.append("none")
    return table, tuple(names)


class MiniHackEnv(gym.Env):
    """One MiniHack task with CORA's settings and a `--obs_mode` observation (see the module docstring).

    Seeded resets seed NetHack itself (`seed(core=s, disp=s, reseed=False)`, as MiniHack does with its level seeds);
    NLE's own `reset(seed=)` seeds only gymnasium's generator. Later resets continue NetHack's random state."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, env_id: str, modification: str | Task = "", obs_mode: str = "pixel_crop",
                 actions: Optional[Sequence[int]] = None, render_mode: Optional[str] = None):
        task = own_task(modification, "MiniHack", env_id)
        validate_task(task)
        self.env_id, self.render_mode = env_id, render_mode
        self.obs_mode = "pixel_crop" if obs_mode == "dqn" else obs_mode
        if self.obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode {obs_mode!r}: MiniHack observes {', '.join(OBS_MODES)}")
        keys = [self.obs_mode] + (["pixel_crop"] if render_mode == "rgb_array" and self.obs_mode != "pixel_crop"
                                  else [])
        self.env = _make(env_id, keys, actions)
        self.actions = tuple(int(a) for a in self.env.unwrapped.actions)
        self.action_space = gym.spaces.Discrete(len(self.actions))
        if self.obs_mode == "pixel_crop":
            self.observation_space = gym.spaces.Box(0, 255, (3, 84, 84), np.uint8)
        else:
            self._table, names = glyph_classes()
            h, w = self.env.observation_space["glyphs_crop"].shape
            self.observation_space = gym.spaces.Box(0.0, 1.0, (len(names), h, w), np.float32)
            self._eye = np.eye(len(names), dtype=np.float32)
        self.modification = task.modification
        self._last: dict = {}

    def set_modifications(self, modification: str | Task) -> None:
        task = own_task(modification, "MiniHack", self.env_id)
        validate_task(task)
        self.modification = task.modification

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self.env.unwrapped.seed(int(seed), int(seed), False)
        obs, info = self.env.reset(seed=seed, options=options)
        return self._obs(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(int(action))
        return self._obs(obs), float(reward), bool(terminated), bool(truncated), info

    def _obs(self, obs: dict) -> np.ndarray:
        self._last = obs
        if self.obs_mode == "pixel_crop":
            return pixel_observation(obs["pixel_crop"])
        return glyph_observation(obs["glyphs_crop"], self._table, self._eye)

    def render(self):
        return np.array(self._last["pixel_crop"]) if "pixel_crop" in self._last else None

    def close(self):
        self.env.close()  # removes NLE's temporary folder


def pixel_observation(crop: np.ndarray) -> np.ndarray:
    """CORA's image: the (144, 144, 3) crop zero-padded by 2 px a side, resized to 84x84 (INTER_AREA), channels
    first."""
    import cv2

    padded = np.pad(crop, ((PIXEL_PAD, PIXEL_PAD), (PIXEL_PAD, PIXEL_PAD), (0, 0)))
    return np.ascontiguousarray(cv2.resize(padded, (84, 84), interpolation=cv2.INTER_AREA).transpose(2, 0, 1))


def glyph_observation(glyphs: np.ndarray, table: np.ndarray, eye: np.ndarray) -> np.ndarray:
    """(h, w) glyph ids -> (C, h, w) one-hot of their classes."""
    return np.ascontiguousarray(eye[table[glyphs]].transpose(2, 0, 1))
