"""IMPALA's actors as Ray actors (`--actor_backend ray`): on this machine or on a Ray cluster, under the same learner.

agents/impala.py's learner drives a fleet of actors through a few calls (`impala.ActorFleet`'s docstring lists
them); this file is the fleet of Ray actors, `RayActorFleet`, read in the order of a run. The Ray actor itself is
`impala.RolloutActor`, next to the actor processes' code (both play unrolls with `impala.Unroller`, so both backends
produce the same unrolls from the same weights and seeds); a Ray worker builds it by name (`ActorHost`), as it
builds the model from `make_agent`'s name. Ray is imported inside functions: importing this file costs nothing.

- Ray: without `--ray_address`, `ray.init(address="local", num_cpus=--num_actors)` starts a Ray instance of the run's
  own on this machine (shut down at the end: no process of it outlives the run); with it, the run joins that cluster
  (its actors are killed at the end, the cluster stays). The run's SIGINT/SIGTERM handlers are kept (`ray.init`
  installs its own);
- actors: `--num_actors` actors of one CPU each, spread over the nodes (`scheduling_strategy="SPREAD"`), each with
  `--num_envs / --num_actors` envs and a CPU copy of the policy;
- requests: the learner keeps `--max_in_flight` requests queued at every actor and sends a new one whenever one
  returns. A request carries the weights (an object ref of the learner's `ray.put`, every `--broadcast_interval`
  updates and at every switch; an actor fetches them once per publication) with their version, and the current
  regime (switch epoch, modification string, the learner step of the switch): every request sent after a switch
  carries it, so a switch reaches every actor at the same global step, at the start of its next requested unroll.
  Requests sent before the switch are played in the old regime (at most max_in_flight per actor), as the process
  backend trains on the old regime's unrolls still in its buffers;
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
  or no unroll from any actor for STALL_TIMEOUT_S ends the run with one line and a crash checkpoint, as the process
  backend's dead actor does; so does an exception in an actor (its traceback in `<run>/actor<i>_traceback.txt`).
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
import sys
import time
from collections import deque
from typing import Optional

import numpy as np
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


def factory_path(fn, architecture: str) -> str:
    """`module:name` of a function or class, importable in a Ray worker (a script's `__main__` is its agent module)."""
    module = SPECS[architecture].module if fn.__module__ == "__main__" else fn.__module__
    return f"{module}:{fn.__qualname__}"


def resolve(path: str):
    """What `factory_path` names, imported by name (in a Ray worker)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class ActorHost:
    """The Ray actor class: builds the object `path` names (`impala.RolloutActor`) in the worker and forwards its
    `where` and `unroll` calls."""

    def __init__(self, path: str, *args):
        self.actor = resolve(path)(*args)

    def where(self) -> dict:
        return self.actor.where()

    def unroll(self, request: dict, weights: list) -> dict:
        return self.actor.unroll(request, weights)


class RayActorFleet:
    """`--num_actors` Ray actors behind agents/impala.py's fleet interface (see `impala.ActorFleet`). `actor_path`
    and `make_agent_path` name the actor class and the model factory (`factory_path`); `unroll_bytes` and
    `weights_bytes` size a local object store."""

    def __init__(self, args: Args, settings: EnvSettings, session: RunSession, actor_path: str, make_agent_path: str,
                 unroll_bytes: int, weights_bytes: int):
        import ray

        self.args, self.settings, self.session = args, settings, session
        self.A, self.n = args.num_actors, args.num_envs // args.num_actors
        self.actor_path, self.make_agent_path = actor_path, make_agent_path
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
            self.init_ray(2 * (self.A * (args.max_in_flight + 1) * unroll_bytes + 4 * weights_bytes))

    def init_ray(self, object_store_bytes: int) -> None:
        import ray

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
        import ray

        remote = ray.remote(ActorHost).options(num_cpus=1, max_restarts=self.args.actor_max_restarts,
                                                max_task_retries=0, scheduling_strategy="SPREAD")
        for i in range(self.A):
            # only actor 0's first env records videos (one file per episode, no name clashes)
            settings = self.settings if i == 0 else dataclasses.replace(self.settings, video_dir=None)
            self.actors.append(remote.remote(self.actor_path, i, self.args, settings, self.n, self.make_agent_path))
        try:
            self.where = ray.get([a.where.remote() for a in self.actors], timeout=START_TIMEOUT_S)
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
        """Actors on the learner's node (it leaves them a core each)."""
        import ray

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
        import ray

        if not (force or version % self.args.broadcast_interval == 0):
            return
        state = {k: t.detach().cpu().numpy().copy() for k, t in folded_state_dict(agent).items()}
        # a switch publishes the weights its hooks changed under the version of the last update: `published` counts
        self.weights_ref, self.version, self.published = ray.put(state), version, self.published + 1

    # --- requests and results ------------------------------------------------------------------------------------
    def request(self, i: int) -> None:
        """One more unroll of actor i, with the newest published weights and the current regime."""
        request = {"published": self.published, "version": self.version, "epoch": self.epoch,
                   "regime": self.session.regime_index(self.modification), "modification": self.modification,
                   "switch_step": self.switch_step,
                   "seed_step": self.session.global_step + SEED_STRIDE * self.incarnation[i],
                   "scaler_row": self.scaler_rows[i]}
        ref = self.actors[i].unroll.remote(request, [self.weights_ref])
        self.in_flight[ref] = (i, self.incarnation[i])

    def get_batch(self, count: int) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Wait for `count` unrolls (requests in flight, restarts, timeouts watched every POLL_S); stack them."""
        import ray

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
        batch = {k: torch.from_numpy(np.stack([it["arrays"][k] for it in items])) for k in items[0]["arrays"]}
        batch.update({k: torch.tensor([it["scalars"][k] for it in items], dtype=torch.int64)
                      for k in items[0]["scalars"]})
        return batch, [it["scalars"]["actor"] for it in items]

    def receive(self, ref) -> None:
        import ray

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
        self.ready.append(result)
        self.stats[i] += result["stats"]
        if result["scaler_row"] is not None:
            self.scaler_rows[i] = result["scaler_row"]
        self.last_progress[i] = self._last_unroll = time.time()
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
        import ray

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
        else:
            print(f"actor {i} restarted: pid {self.where[i]['pid']} on {self.where[i]['host']} after {took:.1f} s",
                  file=sys.stderr, flush=True)
            self.session.logger.record("actor_restarted", self.session.global_step, actor=i,
                                       pid=self.where[i]["pid"], node=self.where[i]["node"], seconds=round(took, 3))
            self.write_actors_file()
        self.last_progress[i] = time.time()
        for _ in range(self.args.max_in_flight):
            self.request(i)

    def failed(self, i: int, e: Exception) -> None:
        cause = getattr(e, "cause", None) or e
        path = os.path.join(self.session.run_dir, f"actor{i}_traceback.txt")
        with open(path, "w") as f:
            f.write(str(e))
        line = one_line(f"{type(cause).__name__}: {cause}")
        raise ActorFailure(f"actor {i} (pid {self.where[i].get('pid')}) failed: {line}; traceback in {path}")

    def check_timeouts(self) -> None:
        import ray

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
        import ray

        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self.actors, self.in_flight, self.restarting = [], {}, {}
        if self.own_ray and ray.is_initialized():
            ray.shutdown()


def ray_session_dir() -> Optional[str]:
    import ray

    with contextlib.suppress(Exception):
        return ray._private.worker._global_node.get_session_dir_path()
    return None


def death_cause(e: Exception) -> str:
    """One line from Ray's account of an actor's death (from 'The actor is dead because', if it says so)."""
    text = one_line(str(e))
    marker = "The actor is dead because"
    if marker in text:
        text = text[text.index(marker):]
    return text[:240]
