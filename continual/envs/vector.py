"""Vector environments whose modifications switch in place.

`make_vector_env` builds one long-lived vector env (async: `continual.envs.grouped`, the envs spread over worker
processes). `switch()` sends
the new modification string to every worker, which swaps its hooks, then resets the envs: no process is created or
left behind. Each env is seeded once (`seed + i`) at the first reset.

A switch to a string with another `env=<id>` token (a task of another game, `continual.modstrings.Task`)
swaps the worker's wrapper stack for that game's, in the same process: each worker builds the stack of every game
in `EnvSettings.games` when it starts (a game not listed is built at its first switch and seeded from the first
reset's seed and the switch step) and keeps them, so a game switch costs what a modification switch does.
`EnvSettings.compat` (`task_compat`) keeps every game's spaces the same.

Per-env wrapper stack (innermost first), as CleanRL's `ppo_atari` but from gymnasium/SB3 wrappers:
backend env (`continual.envs.backends`) -> [Box actions: ClipAction (+ FlattenBoxAction if not 1-D)] ->
[Gymnasium ALE ids: AtariPreprocessing + FrameStackObservation] -> RecordEpisodeStatistics (whole games, inside EpisodicLife) -> RegimeVideo (env 0, --capture_video) ->
NoopReset -> EpisodicLife -> FireReset -> [--her: GoalEnvWrapper (Dict observations, `continual.envs.goals`)] ->
SwitchHandle. Reward clipping/normalisation happens in the learner.

"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import re
import signal
import sys
import time
from typing import Any, Callable, Optional, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.atari_wrappers import EpisodicLifeEnv, FireResetEnv

import continual.envs.goal_grid  # noqa: F401  (registers continual/GoalGrid-v0, the HER goal env)
from continual.envs.backends import (
    PadTask,
    TaskCompat,
    is_atari,
    make_backend_env,
    task_compat,
)
from continual.envs.batched import MinAtarVectorEnv
from continual.envs.goals import needs_objects, wrap_env
from continual.envs.grouped import GroupedVectorEnv
from continual.errors import EnvWorkerError
from continual.modstrings import normalize_modification, parse_eval_modifs, parse_task, parse_tasks, task_env_ids
from continual.processes import dead_workers, describe_worker_failure, mp_context, stop_processes
from continual.testing.faults import inject


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """What a worker needs to build its env (picklable)."""

    env_id: str
    backend: str
    obs_mode: str = "dqn"
    frameskip: int = 4
    buffer_window_size: int = 4
    repeat_action_probability: float = 0.25
    noop_max: int = 30
    episodic_life: bool = True
    max_episode_steps: Optional[int] = None
    video_dir: Optional[str] = None
    video_every: int = 0  # 0: gymnasium's capped cubic schedule
    start_step: int = 0  # global step the envs start at (a resumed run): first video names carry it
    need_objects: bool = False
    her: bool = False  # HER: wrap in continual.envs.goals.GoalEnvWrapper
    game_specific_goals: bool = False
    her_tolerance: float = 0.05
    compat: TaskCompat = TaskCompat()  # a sequence of several games: their common spaces
    games: tuple[str, ...] = ()  # a sequence of several games: their env ids, built by each worker at its start
    task_ids: tuple[str, ...] = ()  # --task_id_input: the curriculum's regimes, whose one-hot joins the observation
    envs_per_worker: int = 0  # the async vector env's envs per worker process (0: spread over the cores)

    def worker_context(self):
        """The multiprocessing context of this run's worker processes (MinAtar's import is preloaded for its runs)."""
        return mp_context(self.atari, ("minatar",) if self.backend == "MinAtar" else ())

    @classmethod
    def from_args(cls, args: Any, video_dir: Optional[str] = None, regimes: Sequence[str] = (),
                  curriculum: Optional[Sequence[str]] = None, **overrides: Any) -> "EnvSettings":
        """`regimes`: every modification string the run can meet (their env tokens decide `compat`); `curriculum`:
        the training curriculum's regimes when `regimes` holds more (evaluation), the task ids of --task_id_input."""
        # MiniHack: the held-out tasks' action sets too, so that training and evaluation envs have one action set
        held_out = parse_eval_modifs(args.eval_modifs) if args.backend == "MiniHack" else []
        values = dict(
            env_id=args.env_id, backend=args.backend, obs_mode=args.obs_mode, frameskip=args.frameskip,
            buffer_window_size=args.buffer_window_size, repeat_action_probability=args.repeat_action_probability,
            noop_max=args.noop_max, episodic_life=not args.deactivate_episodic_life,
            max_episode_steps=args.max_episode_steps, video_dir=video_dir if args.capture_video else None,
            video_every=args.video_every,
            her=getattr(args, "her", False), game_specific_goals=getattr(args, "game_specific_goals", False),
            her_tolerance=getattr(args, "her_tolerance", 0.05), envs_per_worker=getattr(args, "envs_per_worker", 0),
            compat=task_compat(args.backend, task_env_ids(parse_tasks([*regimes, args.modifs, *held_out],
                                                                      args.backend, args.env_id)), args.obs_mode),
        )
        games = task_env_ids(parse_tasks([*regimes, args.modifs], args.backend, args.env_id))
        values["games"] = games if len(games) > 1 else ()
        if getattr(args, "task_id_input", False):
            values["task_ids"] = task_ids(regimes if curriculum is None else curriculum)
        values.update(overrides)
        return cls(**values)

    @property
    def atari(self) -> bool:
        return self.backend in ("HackAtari", "OCAtari") or is_atari(self.env_id)


def task_ids(regimes: Sequence[str]) -> tuple[str, ...]:
    """--task_id_input: the task list, the curriculum's regimes sorted (task i = one-hot entry i)."""
    return tuple(sorted({normalize_modification(m) for m in regimes}))


class TaskIdObservation(gym.ObservationWrapper):
    """--task_id_input: a one-hot of the current task joins the observation, as len(task_ids) constant planes
    after the channels of a (C, H, W) observation (0 or the space's high) or entries after a vector. A regime
    outside the list (an evaluation-only string) gets the all-zero code."""

    def __init__(self, env: gym.Env, task_ids: Sequence[str], modification: str):
        super().__init__(env)
        self.task_ids = list(task_ids)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (1, 3):
            raise ValueError(f"task_id_input: needs vector or (C, H, W) observations, got {space}")
        k = len(self.task_ids)
        self._on = float(np.max(space.high)) if len(space.shape) == 3 and np.isfinite(space.high).all() else 1.0
        extra = (k,) + tuple(space.shape[1:])
        low = np.concatenate([np.broadcast_to(space.low, space.shape), np.zeros(extra)]).astype(space.dtype)
        high = np.concatenate([np.broadcast_to(space.high, space.shape), np.full(extra, self._on)]).astype(space.dtype)
        self.observation_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self._code = np.zeros(extra, dtype=space.dtype)
        self.set_task(modification)

    def set_task(self, modification: str) -> None:
        self._code[:] = 0
        m = normalize_modification(modification)
        if m in self.task_ids:
            self._code[self.task_ids.index(m)] = self._on

    def observation(self, obs):
        return np.concatenate([obs, self._code])


def regime_slug(modification: str) -> str:
    """A file/tag-safe name for a modification string ("" -> "no_modif")."""
    s = normalize_modification(modification)
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", s.replace(" ", "+")) if s else "no_modif"


class RegimeVideo(gym.wrappers.RecordVideo):
    """RecordVideo whose files are named `<regime>__step<global step>-episode-<n>.mp4`.

    Episodes are recorded on gymnasium's capped cubic schedule (0, 1, 8, 27, ..., 729, then every 1000th), as in
    CleanRL, or every `every`-th episode when `every` > 0; in addition the first episode of each regime is recorded,
    once per regime (a curriculum that revisits a regime does not add a video per visit). Episode numbers keep
    counting across switches, so a recurring regime never overwrites its earlier videos.
    """

    def __init__(self, env: gym.Env, video_dir: str, every: int, modification: str, start_step: int = 0):
        self._every = every
        self._regime = modification
        self._recorded_regimes: set[str] = set()
        super().__init__(env, video_dir, episode_trigger=self._trigger,
                         name_prefix=f"{regime_slug(modification)}__step{start_step}", disable_logger=True)

    def _trigger(self, episode_id: int) -> bool:
        first_of_regime = self._regime not in self._recorded_regimes
        self._recorded_regimes.add(self._regime)
        if self._every == 0:
            # imported here: save_video imports moviepy (~0.2 s), which a run without videos never needs
            from gymnasium.utils.save_video import capped_cubic_video_schedule

            return first_of_regime or capped_cubic_video_schedule(episode_id)
        return first_of_regime or episode_id % self._every == 0

    def start_regime(self, modification: str, step: int) -> None:
        self.name_prefix = f"{regime_slug(modification)}__step{step}"
        self._regime = modification

    def stop_recording(self) -> None:
        # a video that cannot be written (full disk, ffmpeg failure) must not stop training: warn once, go on
        try:
            super().stop_recording()
        except Exception as e:
            self.recorded_frames, self.recording, self._video_name = [], False, None
            if not getattr(self, "_video_failed", False):
                self._video_failed = True
                print(f"warning: video write failed in {self.video_folder} ({' '.join(str(e).split())[:200]}); "
                      f"training goes on, later videos are tried again", file=sys.stderr)


class FlattenBoxAction(gym.ActionWrapper):
    """A Box action space of any shape seen as a flat vector: the policy has one Normal dimension per element."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        self.action_space = gym.spaces.Box(space.low.reshape(-1), space.high.reshape(-1), dtype=space.dtype)

    def action(self, action):
        return np.reshape(action, self.env.action_space.shape)


def switch_seed(run_seed: int, step: int) -> int:
    """The seed of the env resets at a switch: a function of the run's seed and the switch step only."""
    return int(np.random.SeedSequence([run_seed, step]).generate_state(1)[0]) % 2**31


class SwitchHandle(gym.Wrapper):
    """Outermost wrapper: `set_modifications` reaches the backend and forces a real reset (not a life reset); a
    string naming another game (`env=` token) first swaps the stack below for that game's (`prebuilt` at the
    worker's start, else `build(modification, step)` now; every stack is kept for the next visit).
    `index`: the env's index in its vector env (fault-injection test hooks target one env)."""

    def __init__(self, env: gym.Env, index: int = 0, env_id: str = "",
                 build: Optional[Callable[[str, int], gym.Env]] = None, prebuilt: Optional[dict] = None,
                 default_env_id: Optional[str] = None):
        super().__init__(env)
        self.index = index
        self.env_id = env_id
        self._default_env_id = default_env_id or env_id  # the game of a string without an env token (--env_id)
        self._build = build
        self._stacks: dict[str, gym.Env] = {**(prebuilt or {}), env_id: env}  # every game's stack, kept
        self._unseeded: set[str] = set(self._stacks)  # seeded by the first seeded reset, when they are first run
        self._seed: Optional[int] = None  # the first seeded reset's seed: envs built later are seeded from it
        self._reseed: Optional[int] = None

    def step(self, action):
        # TEST HOOK (continual.testing.faults), not a test's patch: it fires inside the spawned env worker
        inject("env_step", self.index)  # the worker dies during a step
        return self.env.step(action)

    def reset(self, **kwargs):
        inject("env_reset", self.index)  # TEST HOOK: the worker dies during a reset
        if kwargs.get("seed") is not None:
            self._seed, self._reseed = int(kwargs["seed"]), None
            self._unseeded = set(self._stacks) - {self.env_id}
        elif self._reseed is not None:
            kwargs["seed"], self._reseed = self._reseed, None
        return self.env.reset(**kwargs)

    def set_modifications(self, modification: str, step: int = 0) -> None:
        inject("env_switch", self.index)  # TEST HOOK: the worker dies during a switch
        task = parse_task(modification, env_id=self._default_env_id)
        env_id = task.env_id
        if self._build is not None and env_id != self.env_id:
            if env_id not in self._stacks:  # a game not built at the start
                self._stacks[env_id] = self._build(modification, step)
                self._unseeded.add(env_id)
            self.env, self.env_id = self._stacks[env_id], env_id
            if env_id in self._unseeded and self._seed is not None:  # first run of this env: seeded from the
                self._unseeded.discard(env_id)  # run's seed and the step (not as it would have been at step 0)
                self._reseed = int(np.random.SeedSequence([self._seed, step]).generate_state(1)[0])
        env = self.env
        while isinstance(env, gym.Wrapper):
            if isinstance(env, TaskIdObservation):
                env.set_task(modification)
            if hasattr(env, "was_real_done"):  # SB3 EpisodicLifeEnv: the next reset must restart the game
                env.was_real_done = True
            if isinstance(env, RegimeVideo):
                env.start_regime(modification, step)
            env = env.env
        self.env.get_wrapper_attr("set_modifications")(task)

    def get_ram(self) -> np.ndarray:
        return self.env.unwrapped.ale.getRAM()

    def game(self) -> str:
        """The env id this worker runs now (tests: a game switch really happened in the worker)."""
        return self.env_id

    def close(self):
        for env in self._stacks.values():
            env.close()


class NoopReset(gym.Wrapper):
    """SB3's NoopResetEnv semantics (after the reset, 1..noop_max no-ops drawn from the env's np_random), written
    out because the backend must hear the count before the steps: a HackAtari backend then skips the frame
    processing of the no-ops whose frames never reach the observation, so a switch (which resets every env) costs
    mostly emulation. Same observations as SB3's wrapper (tested)."""

    def __init__(self, env: gym.Env, noop_max: int):
        super().__init__(env)
        assert env.unwrapped.get_action_meanings()[0] == "NOOP"
        self.noop_max = noop_max
        self.lazy = hasattr(env.unwrapped, "upcoming_noops")

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        noops = int(self.unwrapped.np_random.integers(1, self.noop_max + 1))
        if self.lazy:
            self.unwrapped.upcoming_noops(noops)
        for _ in range(noops):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the backend's reset clears skip_observations: the rest fill the stack
                obs, info = self.env.reset(**kwargs)
        return obs, info


def _her_needs_objects(settings: EnvSettings) -> bool:
    return needs_objects(settings.env_id, settings.backend, settings.game_specific_goals)


def make_env(settings: EnvSettings, idx: int, modification: str) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        if mp.current_process().name != "MainProcess":
            # Ctrl-C reaches the whole process group: the learner checkpoints and closes the workers itself
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        def build(mod: str, step: int) -> gym.Env:
            return _build_stack(dataclasses.replace(settings, start_step=step), idx, mod)

        env_id = parse_task(modification, settings.backend, settings.env_id).env_id
        # the other games of the sequence, built now: a game switch then swaps stacks (their first string: "")
        prebuilt = {g: build(f"env={g}", settings.start_step) for g in settings.games if g != env_id}
        return SwitchHandle(build(modification, settings.start_step), idx, env_id, build, prebuilt, settings.env_id)

    return thunk


def _build_stack(settings: EnvSettings, idx: int, modification: str) -> gym.Env:
    """Everything below the SwitchHandle, for the game `modification` names (its env token, else settings.env_id)."""
    task = parse_task(modification, settings.backend, settings.env_id)
    settings = dataclasses.replace(settings, env_id=task.env_id)
    record = settings.video_dir is not None and idx == 0
    env = make_backend_env(
        settings.backend, settings.env_id, task, obs_mode=settings.obs_mode,
        frameskip=settings.frameskip, buffer_window_size=settings.buffer_window_size,
        repeat_action_probability=settings.repeat_action_probability,
        max_episode_steps=settings.max_episode_steps, render_mode="rgb_array" if record else None,
        need_objects=settings.need_objects or (settings.her and _her_needs_objects(settings)),
        full_action_space=settings.compat.full_action_space, actions=settings.compat.actions,
    )
    if settings.compat.obs_shape is not None or settings.compat.num_actions is not None:
        env = PadTask(env, settings.compat.obs_shape, settings.compat.num_actions)
    if isinstance(env.action_space, gym.spaces.Box):
        # CleanRL ppo_continuous_action: the env gets the sample clipped to the bounds (read at every step, so a
        # modification that changes them, Pendulum max_torque=, is followed); the learner keeps the sample
        env = gym.wrappers.ClipAction(env)
        if len(env.action_space.shape) != 1:
            env = FlattenBoxAction(env)
    gym_atari = settings.backend == "Gymnasium" and is_atari(settings.env_id)
    if gym_atari:
        env = gym.wrappers.AtariPreprocessing(env, noop_max=settings.noop_max, frame_skip=settings.frameskip,
                                              screen_size=84, terminal_on_life_loss=False, grayscale_obs=True)
        env = gym.wrappers.FrameStackObservation(env, settings.buffer_window_size)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    if record:
        env = RegimeVideo(env, settings.video_dir, settings.video_every, modification, settings.start_step)
    if settings.atari:
        if settings.noop_max > 0 and not gym_atari:
            env = NoopReset(env, settings.noop_max)
        if settings.episodic_life:
            env = EpisodicLifeEnv(env)
        fire = "FIRE" in env.unwrapped.get_action_meanings()
        if settings.compat.full_action_space:  # all 18 actions are listed: does the game itself use FIRE?
            fire = any(a.name == "FIRE" for a in env.unwrapped.ale.getMinimalActionSet())
        if fire:
            env = FireResetEnv(env)
    if settings.her:
        env = wrap_env(env, settings.env_id, settings.backend, settings.game_specific_goals, settings.her_tolerance)
    if settings.task_ids:
        env = TaskIdObservation(env, settings.task_ids, modification)
    return env


class ContinualVectorEnv(gym.vector.VectorWrapper):
    """A vector env plus the current modification string, an in-place `switch`, and the step cap its games were
    built with (`max_episode_steps`, None: whole games), which evaluation rows report."""

    def __init__(self, env: gym.vector.VectorEnv, modification: str, max_episode_steps: Optional[int] = None):
        super().__init__(env)
        self.modification = normalize_modification(modification)
        self.max_episode_steps = max_episode_steps

    def switch(self, modification: str, step: int = 0, seed: Optional[int] = None) -> tuple[np.ndarray, dict]:
        """Swap every env's modifications and reset them all; returns the new first observations.

        `seed`: the reset is seeded (env i with seed + i), so that a run resumed from the checkpoint taken just before
        a switch plays the same games after it as the uninterrupted run."""
        self.modification = normalize_modification(modification)
        with self._worker_faults():
            self.env.call("set_modifications", self.modification, step)
            return self.env.reset(seed=seed)

    def step(self, actions):
        with self._worker_faults():
            return self.env.step(actions)

    def reset(self, **kwargs):
        with self._worker_faults():
            return self.env.reset(**kwargs)

    def get_ram(self) -> np.ndarray:
        return np.stack(self.env.call("get_ram"))

    def worker_pids(self) -> list[int]:
        return [p.pid for p in getattr(self.unwrapped, "processes", [])]

    @contextlib.contextmanager
    def _worker_faults(self):
        try:
            yield
        except BaseException as e:
            self._broken = True  # the workers' pipes may hold half a message: close() must not talk to them
            processes = getattr(self.unwrapped, "processes", None)
            if not processes or isinstance(e, KeyboardInterrupt):
                raise
            for _ in range(40):  # a worker's death can take a moment to be reaped by the forkserver
                if dead_workers(processes):
                    raise EnvWorkerError(describe_worker_failure(processes, e)) from None
                time.sleep(0.05)
            raise

    def close(self, **kwargs) -> None:
        """Close the workers; if any died (or closing fails), terminate the rest: never leave a process behind."""
        base = self.unwrapped
        processes = list(getattr(base, "processes", []))
        try:
            if getattr(self, "_broken", False) or dead_workers(processes):
                raise EOFError("a worker is dead or its pipe is in an unknown state")
            self.env.close(**kwargs)
        except Exception:
            stop_processes(processes)
            for pipe in getattr(base, "parent_pipes", []):
                pipe.close()
            base.closed = True


def uses_async(atari: bool, num_envs: int, vector_env: str) -> bool:
    """Whether make_vector_env builds worker processes (--vector_env, and auto: Atari with several envs)."""
    return vector_env == "async" or (vector_env == "auto" and atari and num_envs > 1)


def batched_blocker(backend: str, video: bool, her: bool, task_id_input: bool) -> Optional[str]:
    """Why the batched MinAtar vector env cannot run these settings (None: it can): it steps the games below the
    wrappers, so nothing that acts at every step (videos, HER goals, task ids) may be in the stack."""
    if backend != "MinAtar":
        return f"the batched vector env is MinAtar's, not the {backend} backend's"
    for flag, on in (("capture_video", video), ("her", her), ("task_id_input", task_id_input)):
        if on:
            return f"--{flag} needs the sync or async vector env"
    return None


def uses_batched(settings: EnvSettings, vector_env: str) -> bool:
    """--vector_env batched, and auto for MinAtar without videos, HER or task ids (`continual.envs.batched`)."""
    blocked = batched_blocker(settings.backend, settings.video_dir is not None, settings.her, bool(settings.task_ids))
    return vector_env == "batched" or (vector_env == "auto" and blocked is None)


def make_vector_env(settings: EnvSettings, num_envs: int, modification: str,
                    vector_env: str = "auto") -> ContinualVectorEnv:
    fns = [make_env(settings, i, modification) for i in range(num_envs)]
    if uses_batched(settings, vector_env):
        envs = MinAtarVectorEnv(fns, settings.max_episode_steps)
    elif uses_async(settings.atari, num_envs, vector_env):
        envs = GroupedVectorEnv(fns, settings.worker_context().get_start_method(), settings.envs_per_worker)
    else:
        envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return ContinualVectorEnv(envs, modification, settings.max_episode_steps)


def episode_stats(infos: dict) -> list[tuple[int, float, int]]:
    """(env index, return, length) of the whole games that ended in this step (SAME_STEP autoreset keeps the last
    step's info under "final_info")."""
    final = infos.get("final_info")
    if not final or "episode" not in final:
        return []
    ep = final["episode"]
    return [(int(i), float(ep["r"][i]), int(ep["l"][i])) for i in np.flatnonzero(final["_episode"])]

