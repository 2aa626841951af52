"""The async vector env: N envs spread over min(N, cores) worker processes (`--vector_env async`, and auto for Atari).

gymnasium's AsyncVectorEnv runs one process per env and, each step, pickles a message each way per env; with pixel
HackAtari the learner's side of those messages, not the game, caps throughput (~7k steps/s whatever the number of
envs). Here each worker steps a contiguous block of envs (`--envs_per_worker`, default: as many as spread the envs
over the cores), and each step costs one message each way per worker: the learner writes the actions into shared
memory and sends one byte; the worker steps its envs, writes observations, rewards and flags into shared memory and
answers with its envs' info dicts, the only thing pickled (small dicts: cheaper to pickle than numpy arrays), which
the learner batches column by column (`batch_infos`). The shared arrays are raw (no lock, Event or Condition
is shared with a process that can be killed): the pipe's message orders the writes and the reads.

Behaviour is gymnasium's AsyncVectorEnv with SAME_STEP autoreset, step for step (tests/test_envs_grouped.py): the
same env stacks (`continual.envs.vector.make_env`), seeds (`seed + i`), infos (`final_obs`/`final_info`, episode
statistics), `call`/`get_attr`/`set_attr` (switches in place). Envs that share a process do not share Python's
`random`, which HackAtari's modifications draw from: each env keeps its own stream (swapped in around each of its
calls), fresh from the OS as a newly forked process's is, and seeded by its seeded reset as in its own process.
(numpy's global generator, which a HackAtari reset seeds too, is not swapped: no modification draws from it.)

A killed worker is reported in one line naming its envs (`continual.processes.describe_worker_failure`); a worker
whose learner dies sees its pipe close and exits.
"""

from __future__ import annotations

import copy
import ctypes
import multiprocessing as mp
import os
import pickle
import random
import sys
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import logger
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import (
    CloudpickleWrapper,
    batch_space,
    create_shared_memory,
    read_from_shared_memory,
)

from continual.errors import EnvWorkerError
from continual.processes import describe_worker_failure, stop_processes

STEP, CLOSE = b"s", b"c"  # the step and close messages; the others are pickled (command, data) pairs


def worker_blocks(num_envs: int, envs_per_worker: int = 0, cores: Optional[int] = None) -> list[range]:
    """The envs of each worker, contiguous: `envs_per_worker` each (the last fewer), or (0) the envs spread as
    evenly as possible over min(num_envs, cores) workers."""
    if envs_per_worker > 0:
        return [range(s, min(s + envs_per_worker, num_envs)) for s in range(0, num_envs, envs_per_worker)]
    workers = min(num_envs, cores or len(os.sched_getaffinity(0)))
    sizes = [num_envs // workers + (w < num_envs % workers) for w in range(workers)]
    starts = np.cumsum([0] + sizes)
    return [range(int(starts[w]), int(starts[w + 1])) for w in range(workers)]


def _array_actions(space: gym.Space) -> bool:
    """Batched actions that sit in one numpy array (shared memory); others travel in the step message."""
    return isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))


def _actions_view(memory: Any, space: gym.Space) -> Optional[np.ndarray]:
    """The batched actions in shared memory (None: they travel in the step message)."""
    if memory is None:
        return None
    return np.frombuffer(memory, space.dtype, count=int(np.prod(space.shape))).reshape(space.shape)


def _write(view: Any, i: int, value: Any) -> None:
    """Observation `value` into row i of `view` (read_from_shared_memory's arrays: nested for Dict/Tuple spaces)."""
    if isinstance(view, dict):
        for k, v in view.items():
            _write(v, i, value[k])
    elif isinstance(view, tuple):
        for v, x in zip(view, value):
            _write(v, i, x)
    else:
        view[i] = value


def _own(action: Any) -> Any:
    """An action row out of shared memory, copied (the env may keep it; the learner rewrites the row next step)."""
    return action.copy() if isinstance(action, np.ndarray) else action


class GroupedVectorEnv(gym.vector.VectorEnv):
    """`env_fns` over worker processes of `context`, `envs_per_worker` envs each (0: spread over the cores)."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], context: Optional[str] = None,
                 envs_per_worker: int = 0, cores: Optional[int] = None):
        self.num_envs = len(env_fns)
        self.autoreset_mode = AutoresetMode.SAME_STEP
        dummy = env_fns[0]()  # the spaces, before the shared memory is made (as gymnasium's AsyncVectorEnv)
        self.metadata = {**dummy.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = dummy.render_mode
        self.single_observation_space, self.single_action_space = dummy.observation_space, dummy.action_space
        dummy.close()
        del dummy
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        ctx = mp.get_context(context)
        n = self.num_envs
        obs_mem = create_shared_memory(self.single_observation_space, n=n, ctx=ctx)  # lock=False arrays
        rewards_mem, flags_mem = ctx.RawArray(ctypes.c_double, n), ctx.RawArray(ctypes.c_bool, 2 * n)
        act_mem = None
        if _array_actions(self.action_space):
            size = int(np.prod(self.action_space.shape)) * np.dtype(self.action_space.dtype).itemsize
            act_mem = ctx.RawArray(ctypes.c_uint8, max(1, size))
        self._obs = read_from_shared_memory(self.single_observation_space, obs_mem, n=n)
        self._rewards = np.frombuffer(rewards_mem, np.float64)
        self._flags = np.frombuffer(flags_mem, np.bool_).reshape(2, n)
        self._actions = _actions_view(act_mem, self.action_space)
        self.blocks = worker_blocks(n, envs_per_worker, cores)
        self.parent_pipes, self.processes = [], []
        for w, block in enumerate(self.blocks):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, name=f"Worker<GroupedVectorEnv>-{w}", daemon=True,
                            args=(block.start, [CloudpickleWrapper(env_fns[i]) for i in block], child, parent,
                                  (self.single_observation_space, self.action_space),
                                  (obs_mem, rewards_mem, flags_mem, act_mem)))
            # continual.processes.dead_workers names a dead worker by its envs
            p.label = f"env {block.start}" if len(block) == 1 else f"envs {block.start}-{block.stop - 1}"
            p.start()
            child.close()
            self.parent_pipes.append(parent)
            self.processes.append(p)
        self.closed = False
        self._broken = False
        spaces = [x for answer in self._request("spaces", None) for x in answer]
        if any(s != (self.single_observation_space, self.single_action_space) for s in spaces):
            self.close(terminate=True)
            raise RuntimeError("GroupedVectorEnv: the envs' observation or action spaces differ")

    # --- the protocol: one message each way per worker ---------------------------------------------------------------
    def _send(self, message: bytes) -> None:
        if self.closed:
            raise gym.error.ClosedEnvironmentError("Trying to operate on GroupedVectorEnv after close()")
        try:
            for pipe in self.parent_pipes:
                pipe.send_bytes(message)
        except OSError as e:
            self._died(e)

    def _gather(self) -> list:
        """Every worker's answer, in worker order; a worker's error is raised once all answered."""
        out, error = [], None
        try:
            for pipe in self.parent_pipes:
                answer = pickle.loads(pipe.recv_bytes())
                if isinstance(answer, tuple):  # (exception type, message, traceback): the worker has exited
                    error = error or answer
                else:
                    out.append(answer)
        except (EOFError, OSError) as e:
            self._died(e)
        if error is not None:
            self._broken = True
            logger.error(f"Received the following error from a GroupedVectorEnv worker:\n{error[2]}")
            raise error[0](error[1])
        return out

    def _request(self, command: str, data: Any) -> list:
        self._send(pickle.dumps((command, data), protocol=pickle.HIGHEST_PROTOCOL))
        return self._gather()

    def _died(self, error: BaseException) -> None:
        self._broken = True  # a pipe may hold half a message: close() must not talk to the workers
        for _ in range(40):  # a killed worker can take a moment to be reaped
            if any(not p.is_alive() for p in self.processes):
                break
            time.sleep(0.05)
        raise EnvWorkerError(describe_worker_failure(self.processes, error)) from None

    # --- the VectorEnv API ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is None:
            seed = [None] * self.num_envs
        elif isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"If seeds are passed as a list the length must match num_envs={self.num_envs} but "
                             f"got length={len(seed)}.")
        options = dict(options) if options is not None else None
        mask = options.pop("reset_mask") if options is not None and "reset_mask" in options else None
        mask = [True] * self.num_envs if mask is None else [bool(m) for m in mask]
        infos = self._infos(self._request("reset", (seed, options, mask)))
        return self._observations(), infos

    def step(self, actions):
        if self._actions is not None:
            self._actions[...] = actions
            self._send(STEP)
        else:
            self._send(pickle.dumps(("step", list(gym.vector.utils.iterate(self.action_space, actions))),
                                    protocol=pickle.HIGHEST_PROTOCOL))
        infos = self._infos(self._gather())
        return self._observations(), self._rewards.copy(), self._flags[0].copy(), self._flags[1].copy(), infos

    def _infos(self, answers: list[list[dict]]) -> dict:
        return batch_infos([(i, info) for i, info in enumerate(x for a in answers for x in a) if info], self.num_envs)

    def _observations(self):
        return self._obs.copy() if isinstance(self._obs, np.ndarray) else copy.deepcopy(self._obs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(x for answer in self._request("call", (name, args, kwargs)) for x in answer)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"Values must be a list or tuple with length equal to the number of environments. "
                             f"Got `{len(values)}` values for {self.num_envs} environments.")
        self._request("setattr", (name, list(values)))

    def render(self):
        return self.call("render")

    def close_extras(self, timeout: Optional[float] = None, terminate: bool = False, **kwargs: Any) -> None:
        if not (terminate or self._broken):
            try:
                for pipe in self.parent_pipes:
                    pipe.send_bytes(CLOSE)
                for pipe in self.parent_pipes:
                    if pipe.poll(timeout if timeout is not None else 30):
                        pipe.recv_bytes()
            except (EOFError, OSError):
                pass
        stop_processes(self.processes, join_timeout=0 if (terminate or self._broken) else 5.0)
        for pipe in self.parent_pipes:
            pipe.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True) and hasattr(self, "processes"):
            self.close(terminate=True)


def batch_infos(infos: list[tuple[int, dict]], n: int) -> dict:
    """(env index, info) pairs batched as gymnasium's `VectorEnv._add_info` does env by env (the same keys, order,
    arrays, dtypes and masks; tested), column by column: a few numpy calls per key, not per env and key."""
    columns: dict[str, list] = {}
    for i, info in infos:
        for key, value in info.items():
            columns.setdefault(key, []).append((i, value))
    out: dict = {}
    for key, column in columns.items():
        index = [i for i, _ in column]
        first = column[0][1]
        if key != "final_obs" and isinstance(first, dict):
            array = batch_infos(column, n)
        elif key != "final_obs" and (type(first) in (int, float, bool) or issubclass(type(first), np.number)):
            array = np.zeros(n, dtype=type(first))
            array[index] = [v for _, v in column]
        else:
            array = np.zeros((n, *first.shape), dtype=first.dtype) if key != "final_obs" and \
                isinstance(first, np.ndarray) else np.full(n, None, dtype=object)
            for i, v in column:
                array[i] = v
        mask = np.zeros(n, dtype=np.bool_)
        mask[index] = True
        out[key], out[f"_{key}"] = array, mask
    return out


def _worker(first: int, env_fns: list, pipe, parent_pipe, spaces: tuple, memory: tuple) -> None:
    """Worker process: builds envs first.., then answers the learner's messages until `close` or its pipe closes."""
    parent_pipe.close()
    obs_space, action_space = spaces
    obs_mem, rewards_mem, flags_mem, act_mem = memory
    k = len(env_fns)
    n = len(rewards_mem)
    obs = read_from_shared_memory(obs_space, obs_mem, n=n)
    rewards = np.frombuffer(rewards_mem, np.float64)
    flags = np.frombuffer(flags_mem, np.bool_).reshape(2, n)
    actions = _actions_view(act_mem, action_space)
    # each env's own Python `random` (HackAtari's modifications use the global one): a fresh OS-seeded stream, as a
    # forked process's; with one env the process's own is the env's, and nothing is swapped
    swap = k > 1
    streams: list = []
    envs = []
    for fn in env_fns:
        if swap:
            random.seed()
        envs.append(fn.fn())
        streams.append(random.getstate() if swap else None)

    def on(j: int, call: Callable[[], Any]) -> Any:
        if not swap:
            return call()
        random.setstate(streams[j])
        try:
            return call()
        finally:
            streams[j] = random.getstate()

    def step(j: int, action: Any) -> dict:
        env, i = envs[j], first + j
        if swap:
            random.setstate(streams[j])
        o, r, terminated, truncated, info = env.step(action)
        if terminated or truncated:  # SAME_STEP autoreset, as gymnasium's _async_worker
            reset_obs, reset_info = env.reset()
            info = {"final_info": info, "final_obs": o, **reset_info}
            o = reset_obs
        if swap:
            streams[j] = random.getstate()
        _write(obs, i, o)
        rewards[i], flags[0, i], flags[1, i] = r, terminated, truncated
        return info

    def reset(j: int, seed: Optional[int], options: Optional[dict]) -> dict:
        o, info = on(j, lambda: envs[j].reset(seed=seed, options=options))
        _write(obs, first + j, o)
        return info

    try:
        while True:
            message = pipe.recv_bytes()
            if message == STEP:
                answer = [step(j, _own(actions[first + j])) for j in range(k)]
            elif message == CLOSE:
                pipe.send_bytes(CLOSE)
                break
            else:
                command, data = pickle.loads(message)
                if command == "step":
                    answer = [step(j, data[first + j]) for j in range(k)]
                elif command == "reset":
                    seeds, options, mask = data
                    answer = [reset(j, seeds[first + j], options) if mask[first + j] else {} for j in range(k)]
                elif command == "call":
                    name, args, kwargs = data

                    def call(env=None, name=name, args=args, kwargs=kwargs):
                        attr = env.get_wrapper_attr(name)
                        return attr(*args, **kwargs) if callable(attr) else attr

                    answer = [on(j, lambda j=j: call(envs[j])) for j in range(k)]
                elif command == "setattr":
                    name, values = data
                    answer = [envs[j].set_wrapper_attr(name, values[first + j]) for j in range(k)]
                elif command == "spaces":
                    answer = [(env.observation_space, env.action_space) for env in envs]
                else:
                    raise RuntimeError(f"GroupedVectorEnv: unknown command {command!r}")
            pipe.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the learner is gone: exit
    except (KeyboardInterrupt, Exception) as e:
        try:
            pipe.send_bytes(pickle.dumps((type(e), str(e), traceback.format_exc())))
        except Exception:
            pipe.send_bytes(pickle.dumps((RuntimeError, f"{type(e).__name__}: {e}", traceback.format_exc())))
    finally:
        for env in envs:
            try:
                env.close()
            except Exception as e:  # closing must not hide why the worker stops
                print(f"GroupedVectorEnv worker: closing an env failed: {e}", file=sys.stderr)
