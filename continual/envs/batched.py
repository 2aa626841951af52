"""MinAtar games stepped in one loop of the learner's process (`--vector_env batched`, the default for MinAtar).

A MinAtar step is a few microseconds of game logic; through gymnasium's SyncVectorEnv it costs ~10x that in wrapper
calls (SwitchHandle, PadTask, TimeLimit, RecordEpisodeStatistics) and per-env info dicts. `MinAtarVectorEnv` keeps
each env's usual stack (`continual.envs.vector.make_env`: the same seeding, switches in place and game swaps, all
through the stacks) and replaces only `step`: it plays each game's `MinAtarEnv.act` and does in arrays what the
stack's wrappers would do (zero-padding to the sequence's channels and action count, the time limit, episode
returns and lengths, the `no_reward_cutoff` truncation, SAME_STEP autoreset with `final_obs`/`final_info`). Episode
ends reset through the stack, so everything a reset does (a pending reseed after a game swap, the wrappers' own
counters) happens as before.
Games with a numpy port (`continual.envs.minatar_numpy`: Breakout, SpaceInvaders, Freeway) step all their envs in one set
of array operations; the others through MinAtar's Python game, env by env.
Tested equal to SyncVectorEnv step by step (tests/test_envs_batched.py). Not for videos, HER or --task_id_input,
whose wrappers act at every step (`continual.envs.vector.uses_batched` decides).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from continual.envs import minatar_numpy
from continual.testing import faults
from continual.testing.faults import inject


class MinAtarVectorEnv(SyncVectorEnv):
    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], max_episode_steps: int | None = None):
        super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        n = self.num_envs
        self.max_episode_steps = max_episode_steps
        self._buf = np.zeros((n,) + self.single_observation_space.shape, np.float32)
        self._returns = np.zeros(n, np.float64)
        self._lengths = np.zeros(n, np.int64)
        self._started = np.zeros(n, np.float64)  # RecordEpisodeStatistics's episode start time
        self._cutoff = np.zeros(n, np.int64)  # each env's no_reward_cutoff (0: none), read at every reset of all
        self._games: dict[int, tuple] = {}  # id(stack) -> (MinAtarEnv, its number of actions)
        self._ports: dict[str, minatar_numpy.GamePort] = {}  # numpy ports, by game, built when first played
        self._row_port: list = [None] * n  # the port playing each env now (None: MinAtar's Python game)

    def reset(self, *, seed=None, options=None):
        for i in range(self.num_envs):
            self._unload(i)
        obs, infos = super().reset(seed=seed, options=options)
        self._buf[:] = obs
        self._returns[:], self._lengths[:], self._started[:] = 0.0, 0, time.perf_counter()
        for i in range(self.num_envs):
            self._load(i)
            self._cutoff[i] = self._game(i)[0].cutoff  # a switch resets every env: the regime's cutoff
        return obs, infos

    def _final_infos(self, ended: np.ndarray, now: float) -> dict:
        """SyncVectorEnv's SAME_STEP infos of the envs that ended (`_add_info` env by env builds the same dict)."""
        n = self.num_envs

        def mask() -> np.ndarray:
            m = np.zeros(n, np.bool_)
            m[ended] = True
            return m

        final_obs = np.full(n, None, dtype=object)
        for i in ended:
            final_obs[i] = self._buf[i].copy()
        r, ln, t = np.zeros(n, float), np.zeros(n, int), np.zeros(n, float)
        r[ended] = self._returns[ended]
        ln[ended] = self._lengths[ended]
        t[ended] = [round(now - self._started[i], 6) for i in ended]  # RecordEpisodeStatistics's "t"
        episode = {"r": r, "_r": mask(), "l": ln, "_l": mask(), "t": t, "_t": mask()}
        return {"final_obs": final_obs, "_final_obs": mask(), "final_info": {"episode": episode, "_episode": mask()},
                "_final_info": mask()}

    def _load(self, i: int) -> None:
        """After env i's reset: the numpy port of its game takes over its stepping, if there is one."""
        core, _, _, name = self._game(i)
        if name is None:
            return
        port = self._ports.get(name)
        if port is None:
            port = self._ports[name] = minatar_numpy.PORTS[name](self.num_envs, int(self.single_action_space.n))
        port.load(i, core)
        self._row_port[i] = port

    def _unload(self, i: int) -> None:
        """Before env i's reset: its game's RandomState as MinAtar's own stepping would have left it."""
        if self._row_port[i] is not None:
            self._row_port[i].settle(i)
            self._row_port[i] = None

    def _game(self, i: int) -> tuple:
        stack = self.envs[i].env  # below the SwitchHandle: the current game's stack (a game swap replaces it)
        game = self._games.get(id(stack))
        if game is None:
            core = stack.unwrapped
            game = self._games[id(stack)] = (core, core.action_space.n, stack,  # the stack: keeps its id unique
                                             minatar_numpy.port_name(core))
        return game

    def step(self, actions):
        actions = np.asarray(actions)
        n = self.num_envs
        rewards = np.zeros(n, np.float64)
        terminations = np.zeros(n, np.bool_)
        truncations = np.zeros(n, np.bool_)
        infos: dict = {}
        limit = self.max_episode_steps
        if "env_step" in faults._PLAN:
            for i in range(n):
                inject("env_step", i)  # TEST HOOK, as SwitchHandle.step: it fires inside IMPALA's spawned actors
        for port in self._ports.values():
            if port.rows.any():
                idx = np.flatnonzero(port.rows)
                rewards[idx], terminations[idx] = port.step(idx, actions[idx], self._buf)
        for i in [i for i in range(n) if self._row_port[i] is None]:
            core, n_actions, _, _ = self._game(i)
            reward, terminated = core.act(min(int(actions[i]), n_actions - 1))  # PadTask: a missing action is the last
            core.write_obs(self._buf[i])
            rewards[i], terminations[i] = reward, terminated
        self._returns += rewards
        self._lengths += 1
        if limit is not None:
            truncations[:] = self._lengths >= limit
        if self._cutoff.any():  # MinAtarEnv.step's no_reward_cutoff
            truncations |= (self._cutoff > 0) & (self._lengths >= self._cutoff) & (self._returns < 0.1) & ~terminations
        ended = np.flatnonzero(terminations | truncations)
        if len(ended):
            now = time.perf_counter()
            infos = self._final_infos(ended, now)
            for i in ended:
                self._unload(i)
                self._buf[i], _ = self.envs[i].reset()
                self._load(i)
            self._returns[ended], self._lengths[ended], self._started[ended] = 0.0, 0, time.perf_counter()
        self._terminations, self._truncations = terminations, truncations
        return self._buf.copy(), rewards, terminations, truncations, infos
