"""IMPALA's actors as Ray actors (`--actor_backend ray`): on this machine or on a Ray cluster, under the same learner.

agents/impala.py's learner drives a fleet of actors through a few calls (`ActorFleet`'s docstring lists them); this
file is the fleet of Ray actors, `RayActorFleet`, read in the order of a run:

- Ray: without `--ray_address`, `ray.init(address="local", num_cpus=--num_actors)` starts a Ray instance of the run's
  own on this machine (shut down at the end: no process of it outlives the run); with it, the run joins that cluster
  (its actors are killed at the end, the cluster stays). The run's SIGINT/SIGTERM handlers are kept (`ray.init`
  installs its own);
- actors: `--num_actors` `RolloutActor`s of one CPU each, spread over the nodes (`scheduling_strategy="SPREAD"`),
  each with `--num_envs / --num_actors` envs and a CPU copy of the policy. They play unrolls with `impala.Unroller`,
  the code the actor processes run, so both backends produce the same unrolls from the same weights and seeds;
- requests: the learner keeps `--max_in_flight` requests queued at every actor and sends a new one whenever one
  returns. A request carries the weights version and an object ref of those weights (the learner `ray.put`s its
  weights every `--broadcast_interval` updates and at every switch; an actor fetches them only when the version
  changed) and the current regime (switch epoch, modification string, the learner step of the switch): every
  request sent after a switch carries it, so a switch reaches every actor at the same global step, at the start of
  its next requested unroll. Requests sent before the switch are played in the old regime (at most max_in_flight
  per actor), as the process backend trains on the old regime's unrolls still in its buffers;
- results: one unroll as numpy arrays (the fields of `impala.unroll_specs`), which the learner stacks into the batch
  the process backend builds, so everything after `get_batch` (V-trace, CLEAR's replay, P&C, checkpoints) is the
  same code. With max_in_flight 1, broadcast every update and one actor, an unroll is played by the weights one
  update behind the learner's, as the process backend's with a fast learner (tests/test_agents_impala_ray.py
  compares their losses);
- faults: an actor that dies (its process killed, its node lost) fails its requests with `RayActorError`: its
  unroll in flight is dropped (`charts/dropped_unrolls`), the death is printed and recorded in metrics.jsonl (kind
  `actor_restart`), and Ray restarts it (`max_restarts` = `--actor_max_restarts`; the learner sends it new requests
  once a probe says it is back, with its reward scaler and new seeds). One death more than that, an actor not back
  within RESTART_TIMEOUT_S, an actor whose requests make no progress for REQUEST_TIMEOUT_S (killed, so it restarts),
  or no unroll from any actor for impala.STALL_TIMEOUT_S ends the run with one line and a crash checkpoint, as the
  process backend's dead actor does; so does an exception in an actor (its traceback in `<run>/actor<i>_traceback.txt`).
  Every wait of the learner has a timeout. A killed learner takes its local Ray instance with it (Ray's processes
  die with their parent), and on a cluster Ray kills the actors of a driver that is gone; `--resume` continues from
  the last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import socket
import sys
import time
from collections import deque
from typing import Optional

import numpy as np
import ray
import torch
import torch.nn as nn

from continual.config.args import Args
from continual.envs.vector import EnvSettings
from continual.errors import ActorFailure, UserError, one_line
from continual.io import atomic_write_json
from continual.plasticity.injection import folded_state_dict
from continual.specs import SPECS
from continual.training.rewards import state_from_row, state_to_row
from continual.training.session import RunSession

POLL_S = 0.1  # ray.wait's timeout in the learner's loop (it also watches the timeouts below)
START_TIMEOUT_S = 300.0  # the actors must be up by then (a cluster without a free CPU per actor never gets there)
RESTART_TIMEOUT_S = 300.0  # a dead actor must be back by then
REQUEST_TIMEOUT_S = 600.0  # an actor with requests but no result for this long is hung: killed (Ray restarts it)
STALL_TIMEOUT_S = 900.0  # no unroll from any actor for this long: the run ends (agents/impala.py's value)
GET_TIMEOUT_S = 60.0  # fetching a result or the weights once Ray said they are ready
SEED_STRIDE = 1_000_003  # a restarted actor's seeds: start step + this x its restarts
UNROLL_FIELDS = ("obs", "action", "logits", "value", "reward", "raw_reward", "done", "ep_return", "ep_length", "ep_t")
SCALAR_FIELDS = ("epoch", "regime", "version", "actor", "ep_count")


def agent_factory_path(fn, architecture: str) -> str:
    """`module:name` of the model factory, importable in a Ray worker (a script's `__main__` is its agent module)."""
    module = SPECS[architecture].module if fn.__module__ == "__main__" else fn.__module__
    return f"{module}:{fn.__qualname__}"


def resolve(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class RolloutActor:
    """One Ray actor: its envs and policy copy (`impala.Unroller`, built at its first request: that request's regime,
    step and reward scaler, so a restarted actor starts where the run is) and one unroll per request."""

    def __init__(self, index: int, args: Args, settings: EnvSettings, n: int, make_agent_path: str):
        with contextlib.suppress(ValueError):  # Ctrl-C reaches the process group: the learner stops us
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(1)
        self.index, self.args, self.settings, self.n = index, args, settings, n
        self.make_agent_path = make_agent_path
        self.unroller = None
        self.epoch: Optional[int] = None
        self.published: Optional[int] = None  # the learner's publication whose weights we hold
        self.version: Optional[int] = None  # its version (the learner's updates before it)
        self.idle_since: Optional[float] = None

    def where(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    def unroll(self, request: dict, weights: list) -> dict:
        """`request`: published, version, epoch, regime, modification, switch_step, seed_step, scaler_row;
        `weights`: [the object ref of the weights of that publication] (in a list: Ray leaves it to us to fetch, once
        per publication)."""
        from agents import impala

        t0 = time.time()
        wait_s = t0 - self.idle_since if self.idle_since is not None else 0.0
        if self.unroller is None:
            self.unroller = impala.Unroller(self.index, self.args, self.settings, request["modification"],
                                            request["seed_step"], self.n, request["scaler_row"],
                                            resolve(self.make_agent_path))
            self.epoch = request["epoch"]
            specs = impala.unroll_specs(self.args.unroll_length, self.n, self.unroller.envs.single_observation_space,
                                        int(self.unroller.envs.single_action_space.n))
            self.specs = {k: v for k, v in specs.items() if k in UNROLL_FIELDS}
        elif request["epoch"] != self.epoch:
            self.unroller.switch(request["modification"], request["switch_step"])
            self.epoch = request["epoch"]
        if request["published"] != self.published:
            state = ray.get(weights[0], timeout=GET_TIMEOUT_S)
            with torch.no_grad():
                for k, t in self.unroller.weights.items():
                    t.copy_(torch.as_tensor(state[k]))
            self.published, self.version = request["published"], request["version"]
        out = {k: torch.zeros(shape, dtype=dtype).numpy() for k, (shape, dtype) in self.specs.items()}
        n_eps, env_s = self.unroller.play(out)
        t2 = time.time()
        self.idle_since = t2
        out.update(epoch=request["epoch"], regime=request["regime"], version=self.version, actor=self.index,
                   ep_count=n_eps, pid=os.getpid(), scaler_row=self.unroller.scaler_row(),
                   # env stepping, the rest (inference, weights, switches), waiting for this request
                   stats=(env_s, (t2 - t0) - env_s, wait_s))
        return out


class RayActorFleet:
    """`--num_actors` Ray actors behind agents/impala.py's fleet interface (see `impala.ActorFleet`)."""

    def __init__(self, args: Args, settings: EnvSettings, session: RunSession, obs_space, n_actions: int,
                 make_agent_fn=None):
        from agents import impala

        self.args, self.settings, self.session = args, settings, session
        self.A, self.n = args.num_actors, args.num_envs // args.num_actors
        self.make_agent_path = agent_factory_path(make_agent_fn or impala.make_agent, args.architecture)
        self.modification = session.modification
        self.epoch = session.switches  # switch epochs keep counting across resumes
        self.epoch_modification = {self.epoch: session.modification}
        self.switch_step = session.global_step
        self.scaler_rows: list[Optional[list[float]]] = [None] * self.A
        self.actors: list = []
        self.where: list[dict] = [{} for _ in range(self.A)]
        self.in_flight: dict = {}  # object ref -> (actor, its incarnation when sent)
        self.ready: deque[dict] = deque()
        self.incarnation = [0] * self.A  # deaths noticed so far (= restarts asked of Ray)
        self.restarting: dict = {}  # actor -> (probe ref, since)
        self.last_progress = [time.time()] * self.A
        self.dropped = 0
        self.weights_ref, self.version, self.published = None, None, 0
        self.stats = np.zeros((self.A, 3))
        self._last_stats = np.zeros((self.A, 3))
        self._last_unroll = time.time()
        self.own_ray = not ray.is_initialized()  # a caller's Ray (a notebook, a benchmark) is left running
        if self.own_ray:
            unroll_bytes = sum(int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
                               for shape, dtype in impala.unroll_specs(args.unroll_length, self.n, obs_space,
                                                                       n_actions).values())
            weights_bytes = sum(t.numel() * t.element_size() for t in
                                (make_agent_fn or impala.make_agent)(obs_space, n_actions, args).state_dict().values())
            self.init_ray(2 * (self.A * (args.max_in_flight + 1) * unroll_bytes + 4 * weights_bytes))

    def init_ray(self, object_store_bytes: int) -> None:
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        # the actors import agents.* and the env modules as the learner does: the repository root and the learner's
        # PYTHONPATH (the same paths on every node; Ray itself adds the working directory and the script's folder)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                      runtime_env={"env_vars": {"PYTHONPATH": path}})
        try:
            if self.args.ray_address:
                ray.init(address=self.args.ray_address, **kwargs)
            else:  # "local": an instance of our own, even when `ray start` left one running on this machine
                ray.init(address="local", num_cpus=self.A, object_store_memory=max(100 << 20, object_store_bytes),
                         **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {self.args.ray_address}" if self.args.ray_address else "a local Ray instance"
            raise UserError(f"ray_address: cannot start or join {where}: {one_line(str(e))[:300]}") from None
        finally:
            for s, h in handlers.items():  # the run's: finish the update, checkpoint (ray.init sets its own)
                signal.signal(s, h)

    # --- start and placement -------------------------------------------------------------------------------------
    def start(self) -> None:
        remote = ray.remote(RolloutActor).options(num_cpus=1, max_restarts=self.args.actor_max_restarts,
                                                   max_task_retries=0, scheduling_strategy="SPREAD")
        for i in range(self.A):
            # only actor 0's first env records videos (one file per episode, no name clashes)
            settings = self.settings if i == 0 else dataclasses.replace(self.settings, video_dir=None)
            self.actors.append(remote.remote(i, self.args, settings, self.n, self.make_agent_path))
        probes = [a.where.remote() for a in self.actors]
        try:
            self.where = ray.get(probes, timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise ActorFailure(f"the {self.A} Ray actors did not all start within {START_TIMEOUT_S:.0f} s (each needs "
                               f"1 CPU; Ray has {ray.available_resources().get('CPU', 0):g} CPUs free)") from None
        except ray.exceptions.RayError as e:
            raise ActorFailure(f"a Ray actor failed to start: {death_cause(e)}") from None
        now = time.time()
        self.last_progress = [now] * self.A
        self._last_unroll = now
        for i in range(self.A):
            for _ in range(self.args.max_in_flight):
                self.request(i)

    def pids(self) -> list[int]:
        return [w.get("pid") for w in self.where]

    def local_actors(self) -> int:
        node = ray.get_runtime_context().get_node_id()
        return sum(w.get("node") == node for w in self.where)

    def describe(self) -> dict:
        return {"backend": "ray", "actors": self.pids(), "nodes": [w.get("node") for w in self.where],
                "hosts": [w.get("host") for w in self.where], "restarts": list(self.incarnation),
                "ray_session_dir": ray_session_dir()}

    def write_actors_file(self) -> None:
        atomic_write_json(os.path.join(self.session.run_dir, "actors.json"), {"learner": os.getpid(),
                                                                             **self.describe()})

    # --- the curriculum's view: an env-like object with `.modification` and `.switch` -----------------------------
    def switch(self, modification: str, step: int = 0, seed: Optional[int] = None):
        """Every request from now on carries the new regime (`seed` unused: the actors run asynchronously)."""
        self.epoch += 1
        self.modification, self.switch_step = modification, step
        self.epoch_modification[self.epoch] = modification
        return None, {}

    # --- weights -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def publish(self, agent: nn.Module, version: int, force: bool = False) -> None:
        """`ray.put` the weights after `version` updates, every --broadcast_interval updates (`force`: now); requests
        sent from now on carry them."""
        if not (force or version % self.args.broadcast_interval == 0):
            return
        state = {k: t.detach().cpu().numpy().copy() for k, t in folded_state_dict(agent).items()}
        # a switch publishes the weights its hooks changed under the version of the last update: `published` counts
        self.weights_ref, self.version, self.published = ray.put(state), version, self.published + 1

    # --- requests and results ------------------------------------------------------------------------------------
    def request(self, i: int) -> None:
        """One more unroll of actor i, with the newest published weights and the current regime."""
        request = {"published": self.published, "version": self.version, "epoch": self.epoch, "regime": self.session.regime_index(self.modification),
                   "modification": self.modification, "switch_step": self.switch_step,
                   "seed_step": self.session.global_step + SEED_STRIDE * self.incarnation[i],
                   "scaler_row": self.scaler_rows[i]}
        ref = self.actors[i].unroll.remote(request, [self.weights_ref])
        self.in_flight[ref] = (i, self.incarnation[i])

    def get_batch(self, count: int) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Wait for `count` unrolls (requests in flight, restarts, timeouts watched every POLL_S); stack them."""
        while len(self.ready) < count:
            refs = list(self.in_flight) + [probe for probe, _ in self.restarting.values()]
            done, rest = ray.wait(refs, num_returns=1, timeout=POLL_S) if refs else ([], [])
            if done and rest:  # whatever else is ready too
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                done += more
            for ref in done:
                self.receive(ref)
            self.check_timeouts()
        items = [self.ready.popleft() for _ in range(count)]
        batch = {k: torch.from_numpy(np.stack([it[k] for it in items])) for k in UNROLL_FIELDS}
        batch.update({k: torch.tensor([it[k] for it in items], dtype=torch.int64) for k in SCALAR_FIELDS})
        return batch, [it["actor"] for it in items]

    def receive(self, ref) -> None:
        probe = next((i for i, (p, _) in self.restarting.items() if p == ref), None)
        if probe is not None:
            return self.restarted(probe, ref)
        if ref not in self.in_flight:  # a request of an actor that died (dropped in `died`)
            return
        i, incarnation = self.in_flight.pop(ref)
        try:
            result = ray.get(ref, timeout=GET_TIMEOUT_S)
        except ray.exceptions.RayActorError as e:
            self.dropped += 1
            if incarnation == self.incarnation[i]:  # the first news of this death (its other requests die with it)
                self.died(i, death_cause(e))
            return
        except ray.exceptions.RayTaskError as e:  # an exception in the actor: the run ends, as with actor processes
            self.failed(i, e)
        except ray.exceptions.RayError as e:  # the result is lost (its node died after playing it): dropped
            self.dropped += 1
            print(f"actor {i}: unroll lost ({type(e).__name__}: {one_line(str(e))[:200]}); dropped", file=sys.stderr,
                  flush=True)
            if i not in self.restarting:
                self.request(i)
            return
        now = time.time()
        self.ready.append(result)
        self.stats[i] += result["stats"]
        if result["scaler_row"] is not None:
            self.scaler_rows[i] = result["scaler_row"]
        self.last_progress[i] = self._last_unroll = now
        if i not in self.restarting:
            self.request(i)

    def died(self, i: int, cause: str) -> None:
        """Actor i died: drop its requests' results as they fail, ask whether Ray restarts it (a probe that waits for
        it), or end the run when it has no restarts left."""
        self.incarnation[i] += 1
        restarts, allowed = self.incarnation[i], self.args.actor_max_restarts
        who = f"actor {i} (pid {self.where[i].get('pid')} on {self.where[i].get('host')})"
        if restarts > allowed:
            raise ActorFailure(f"{who} died: {cause}; no restarts left (--actor_max_restarts {allowed})")
        if self.session.stop_signal is not None:  # SIGTERM to the process group reached Ray too: the interruption
            raise ActorFailure(f"{who} died: {cause}")
        print(f"{who} died: {cause}; its unroll in flight is dropped, Ray restarts it ({restarts} of {allowed} "
              f"restarts)", file=sys.stderr, flush=True)
        self.session.logger.record("actor_restart", self.session.global_step, actor=i, pid=self.where[i].get("pid"),
                                   node=self.where[i].get("node"), cause=cause, restarts=restarts,
                                   dropped_unrolls=self.dropped)
        for ref, (j, _) in list(self.in_flight.items()):  # they fail with the old process: no need to wait
            if j == i:
                del self.in_flight[ref]
                self.dropped += 1
        # a probe that Ray retries until the actor is back (or raises when Ray gives up on it)
        self.restarting[i] = (self.actors[i].where.options(max_task_retries=-1).remote(), time.time())

    def restarted(self, i: int, probe) -> None:
        _, since = self.restarting.pop(i)
        before = self.where[i]
        try:
            self.where[i] = ray.get(probe, timeout=GET_TIMEOUT_S)
        except ray.exceptions.RayError as e:
            raise ActorFailure(f"actor {i} died and was not restarted: {death_cause(e)}") from None
        took = time.time() - since
        if self.where[i] == before:  # the same process: it was unreachable for a while, not dead
            self.incarnation[i] -= 1
            print(f"actor {i} (pid {before.get('pid')}) answers again after {took:.1f} s: it was unreachable, not "
                  f"restarted", file=sys.stderr, flush=True)
            for _ in range(self.args.max_in_flight):
                self.request(i)
            return
        print(f"actor {i} restarted: pid {self.where[i]['pid']} on {self.where[i]['host']} after {took:.1f} s",
              file=sys.stderr, flush=True)
        self.session.logger.record("actor_restarted", self.session.global_step, actor=i, pid=self.where[i]["pid"],
                                   node=self.where[i]["node"], seconds=round(took, 3))
        self.last_progress[i] = time.time()
        self.write_actors_file()
        for _ in range(self.args.max_in_flight):
            self.request(i)

    def failed(self, i: int, e: Exception) -> None:
        cause = getattr(e, "cause", None) or e
        tb = str(e)
        path = os.path.join(self.session.run_dir, f"actor{i}_traceback.txt")
        with open(path, "w") as f:
            f.write(tb)
        line = one_line(f"{type(cause).__name__}: {cause}")
        raise ActorFailure(f"actor {i} (pid {self.where[i].get('pid')}) failed: {line}; traceback in {path}")

    def check_timeouts(self) -> None:
        now = time.time()
        for i, (_, since) in list(self.restarting.items()):
            if now - since > RESTART_TIMEOUT_S:
                raise ActorFailure(f"actor {i} died and was not back within {RESTART_TIMEOUT_S:.0f} s (each actor "
                                   f"needs 1 CPU; Ray has {ray.available_resources().get('CPU', 0):g} free)")
        for i in range(self.A):
            busy = any(j == i for j, _ in self.in_flight.values())
            if busy and i not in self.restarting and now - self.last_progress[i] > REQUEST_TIMEOUT_S:
                print(f"actor {i} (pid {self.where[i].get('pid')}): no unroll for {REQUEST_TIMEOUT_S:.0f} s; killing "
                      f"it (Ray restarts it)", file=sys.stderr, flush=True)
                self.last_progress[i] = now
                ray.kill(self.actors[i], no_restart=False)
        if now - self._last_unroll > STALL_TIMEOUT_S:
            raise ActorFailure(f"no unroll from any actor for {STALL_TIMEOUT_S:.0f} s (actor pids {self.pids()})")

    # --- scalars and reward scalers ------------------------------------------------------------------------------
    def stats_delta(self) -> dict[str, float]:
        """Actor time since the last call, summed over actors (env stepping, inference + bookkeeping, waiting for a
        request), the share of it spent busy, and the restarts and dropped unrolls so far."""
        d = (self.stats - self._last_stats).sum(0)
        self._last_stats = self.stats.copy()
        env_s, act_s, wait_s = float(d[0]), float(d[1]), float(d[2])
        busy = env_s + act_s
        return {"time/actor_env_s": env_s, "time/actor_act_s": act_s, "time/actor_wait_s": wait_s,
                "time/actor_utilisation": busy / (busy + wait_s) if busy + wait_s > 0 else float("nan"),
                "charts/actor_restarts": float(sum(self.incarnation)), "charts/dropped_unrolls": float(self.dropped)}

    def scaler_states(self) -> list:
        return [state_from_row(row, self.args.reward_scaling) if row is not None else None for row in self.scaler_rows]

    def load_scaler_states(self, states: list) -> None:
        """The actors' reward scalers as a checkpoint had them (sent with each actor's first request)."""
        for i, st in enumerate(states[:self.A]):
            if st is not None:
                self.scaler_rows[i] = list(state_to_row(st))

    # --- shutdown ----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every actor (no restart); a Ray instance of our own is shut down with all its processes."""
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self.actors, self.in_flight, self.restarting = [], {}, {}
        if self.own_ray and ray.is_initialized():
            ray.shutdown()


def ray_session_dir() -> Optional[str]:
    with contextlib.suppress(Exception):
        return ray._private.worker._global_node.get_session_dir_path()
    return None


def death_cause(e: Exception) -> str:
    """One line from Ray's account of an actor's death (the sentence after 'The actor is dead because', if any)."""
    text = one_line(str(e))
    marker = "The actor is dead because"
    if marker in text:
        text = text[text.index(marker):]
    return text[:240]
