"""Continual IMPALA: actor processes and a V-trace learner, trained through a curriculum of environment modifications.

Run it directly (`python agents/impala.py --config configs/impala_freeway.json`) or through
`python continual_training_example.py --architecture IMPALA`. The learner reads top to bottom in `train()`:
wait for `--batch_size` unrolls -> ask the curriculum -> V-trace -> one RMSprop step -> publish the weights.

Design (MonoBeast-style, one machine; `--actor_backend ray` puts the actors on Ray, on this machine or a cluster,
under the same learner: agents/impala_ray.py):
- actors: `--num_actors` processes (forkserver, started once), each stepping `--num_envs / --num_actors` envs (a sync
  vector env inside the actor process) with a CPU copy of the policy (`Unroller`, which the Ray actors run too). An
  unroll is `--unroll_length` (T) steps of every env of the actor: observations (T+1 rows, the last one bootstraps),
  actions, behaviour logits, raw and scaled rewards, dones, the finished episodes, the regime it came from (switch
  epoch and regime index) and the version of the weights that played it (the learner's updates before them). The
  learner talks to the actors through a fleet (`ActorFleet` here, `impala_ray.RayActorFleet` with `RolloutActor`s on
  Ray): start, publish, switch, get_batch, close;
- transfer: unrolls are written into pre-allocated shared-memory tensors (`num_buffers` slots, a few per actor); slot
  indices travel through one pipe per actor (a few bytes each): observations are never pickled. No lock, Event or
  Queue is shared with an actor (a SIGKILLed actor would hold it forever): each pipe has one writer per direction, the
  stop flag and the weight version are shared-memory tensors the learner alone writes, and every wait of the learner
  has a timeout and watches the actors' sentinels;
- weights: after every update (every `--broadcast_interval` updates, and at every switch) the learner copies its
  weights into a shared-memory model under a seqlock counter (odd while writing); actors poll the counter at unroll
  boundaries and copy the weights when it changed, so they never stop. The behaviour logits are recorded, so V-trace
  corrects whatever policy lag remains (`charts/policy_lag`: updates between the weights that played an unroll and
  those that train on it);
- curriculum: the learner's step count (env steps it consumed: batch_size * T * envs_per_actor per update) decides the
  regime. `session.maybe_switch(fleet)` calls `fleet.switch(new, step)`, which sends the new modification string
  through every actor's pipe; each actor switches its envs in place at its next unroll boundary. Unrolls of the
  previous regime still in the buffers (at most `num_buffers`) are trained on: they are off-policy by at most a few
  updates (V-trace corrects the lag) and come from the previous MDP, like the last moments before the switch. Their
  episodes are logged under the regime of the unroll, and `charts/previous_regime_unrolls` counts them;
- shutdown: Ctrl-C/SIGTERM finish the update in progress, then checkpoint (`interrupted__step<N>`, exit 128+signal;
  actors ignore SIGINT, and a SIGTERM that killed them too still counts as an interruption). An actor that dies or
  raises, or a non-finite loss, ends the run with one line, `error: actor 1 (pid N) died: exit code -9; saved
  <run>/checkpoints/crash__step<N>.cleanrl_model` (the last completed update; an actor's traceback goes to
  `<run>/actor<i>_traceback.txt`), exit code 1. Whatever ends the run (also the end of training or a learner
  exception) stops every actor: a stop flag, joins with timeouts, then SIGTERM, then SIGKILL. Actors also exit when
  the learner is killed (they watch its sentinel and their pipe). Actor pids are printed and written to
  `<run>/actors.json`.

Devices: actors run on CPU (one torch thread each); the learner uses the GPU with `--cuda` when there is one, else the
CPU with (cores - num_actors) torch threads (oversubscribed OpenMP threads slow it down many times over).

Continual specifics (as agents/ppo.py): time-limit truncations are bootstrapped by the actor from the value of the
final observation (its copy of the weights); at a switch the envs reset and the cut episode is bootstrapped from the
last observation of the unroll, never treated as a termination; the learning rate anneals over the whole run and the
RMSprop state carries across switches (unless `--reset_optimizer_on_switch`).

Spec (continual/specs.py):
- its own defaults: --learning_rate 0.0006 --max_grad_norm 40.0
- supports: actors, ewc, mlp_network, network_options, plasticity, shrink_and_perturb
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import time
import traceback
from collections import deque
from multiprocessing import forkserver
from multiprocessing.connection import wait
from typing import Callable, NamedTuple, Optional, Sequence

if __package__ in (None, ""):  # `python agents/impala.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

from agents import impala_ray, networks
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.envs.vector import EnvSettings, episode_stats, make_env, make_vector_env, uses_batched
from continual.errors import ActorFailure
from continual.io import atomic_write_json
from continual.methods import AgentForm, EWCForm, add_continual
from continual.plasticity.injection import folded_state_dict
from continual.processes import mp_context, stop_processes
from continual.testing.faults import inject, kill_at
from continual.training.extensions import Extension
from continual.training.guards import check_losses, check_parameters
from continual.training.rewards import RewardScaler, state_from_row, state_to_row
from continual.training.session import RunSession
from continual.training.startup import agent_main, start_run

STALL_TIMEOUT_S = 900.0  # no unroll from any live actor for this long: report a stall instead of waiting forever
JOIN_TIMEOUT_S = 5.0  # per actor, before SIGTERM, then SIGKILL
POLL_S = 0.1  # how often a waiting actor or learner looks at the stop flag and the other side's liveness


# --------------------------------------------------------------------------------------------------------------------
# V-trace (Espeholt et al. 2018)
# --------------------------------------------------------------------------------------------------------------------


class VTrace(NamedTuple):
    vs: torch.Tensor  # value targets v_s, [T, B]
    pg_advantages: torch.Tensor  # rho_s (r_s + gamma_s v_{s+1} - V(x_s)), [T, B]
    rhos: torch.Tensor  # unclipped importance weights pi/mu of the taken actions, [T, B]


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor,
           values: torch.Tensor, bootstrap_value: torch.Tensor, rho_bar: float = 1.0, c_bar: float = 1.0) -> VTrace:
    """V-trace targets and policy-gradient advantages for [T, B] unrolls.

    `discounts[t]` = gamma * (1 - done[t]): 0 where the episode ended at step t, which cuts every sum at episode ends.
    `values[t]` = V(x_t) for t < T, `bootstrap_value` = V(x_T). With rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu)
    and delta_t = rho_t (r_t + discount_t V(x_{t+1}) - V(x_t)), the backward recursion (Remark 1 of the paper)
        v_t - V(x_t) = delta_t + discount_t c_t (v_{t+1} - V(x_{t+1})),   v_T = V(x_T)
    equals v_s = V(x_s) + sum_t (prod_{i<t} discount_i c_i) delta_t. The policy-gradient advantage is
    rho_t (r_t + discount_t v_{t+1} - V(x_t)) (the same rho_bar truncates both).
    """
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = torch.clamp(rhos, max=c_bar)
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], 0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    vs_minus_v = torch.empty_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], 0)
    pg_advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return VTrace(vs, pg_advantages, rhos)


class Losses(NamedTuple):
    logits: torch.Tensor  # [T, B, n]
    logp: torch.Tensor  # log pi(.|x_t), [T, B, n]
    values: torch.Tensor  # V(x_t), [T+1, B]
    action_logp: torch.Tensor  # log pi(a_t|x_t), [T, B]
    behaviour_logp: torch.Tensor  # log mu(a_t|x_t), [T, B]
    vt: VTrace
    pg_loss: torch.Tensor  # sums over the T x B samples
    v_loss: torch.Tensor


def vtrace_losses(agent: nn.Module, obs: torch.Tensor, actions: torch.Tensor, behaviour_logits: torch.Tensor,
                  rewards: torch.Tensor, dones: torch.Tensor, args: Args) -> Losses:
    """The V-trace policy-gradient and value losses of time-major unrolls (obs [T+1, B, ...], the rest [T, B, ...]);
    the learner's update and EWC's Fisher (CORA's: the squared gradient of pg + baseline loss) both use them."""
    T, B = actions.shape[:2]
    logits, values = logits_and_values(agent, obs.reshape((T + 1) * B, *obs.shape[2:]))
    logits, values = logits.view(T + 1, B, -1)[:T], values.view(T + 1, B)
    logp = F.log_softmax(logits, -1)
    action_logp = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    behaviour_logp = F.log_softmax(behaviour_logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    discounts = args.gamma * (~dones).float()
    vt = vtrace(behaviour_logp, action_logp.detach(), rewards, discounts, values[:T].detach(),
                values[T].detach(), rho_bar=args.vtrace_rho_bar, c_bar=args.vtrace_c_bar)
    # sums over the T x B samples, as in TorchBeast and cleanba: IMPALA's usual learning rate, RMSprop epsilon and
    # clipping norm (configs/impala_*.json) assume that scale; they are logged as means
    pg_loss = -(action_logp * vt.pg_advantages).sum()
    v_loss = 0.5 * ((vt.vs - values[:T]) ** 2).sum()
    return Losses(logits, logp, values, action_logp, behaviour_logp, vt, pg_loss, v_loss)


def ewc_batch_loss(args: Args):
    """EWC's `--ewc_fisher cora` loss (CORA's checkpoint_task): pg + vf_coef * value loss, no entropy, on a batch of
    stored unrolls (rows [n, T(+1), ...], batch-major as `observe` stores them)."""
    def loss(agent: nn.Module, batch: dict) -> torch.Tensor:
        tm = {k: v.transpose(0, 1) for k, v in batch.items()}
        out = vtrace_losses(agent, tm["obs"], tm["action"], tm["logits"], tm["reward"], tm["done"], args)
        return out.pg_loss + args.vf_coef * out.v_loss
    return loss


# how IMPALA's learner meets the continual methods (continual/methods.py); EWC's rows are unrolls of T steps
CONTINUAL = AgentForm(ewc=EWCForm(networks.policy_head, ewc_batch_loss, row_steps=lambda args: args.unroll_length),
                      plasticity=True)


# --------------------------------------------------------------------------------------------------------------------
# network: the PPO agent's (Nature CNN / MLP, policy and value heads), so eval.py loads IMPALA checkpoints unchanged
# --------------------------------------------------------------------------------------------------------------------


def make_agent(obs_space, action_space, args: Args) -> networks.Agent:
    """`action_space`: the env's single action space or its number of actions (agents/networks.py's contract)."""
    return networks.make_agent(obs_space, action_space, args)


def logits_and_values(agent: networks.Agent, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(agent, "logits_and_values"):  # a variant's model (agents/pnc.py: the active column acts and learns)
        return agent.logits_and_values(obs)
    hidden, critic_hidden = agent.torsos(obs)
    return agent.actor(hidden), agent.critic(critic_hidden).squeeze(-1)


# --------------------------------------------------------------------------------------------------------------------
# actors
# --------------------------------------------------------------------------------------------------------------------


def unroll_specs(T: int, n: int, obs_space, n_actions: int) -> dict[str, tuple[tuple, torch.dtype]]:
    """The fields of one unroll (shape, dtype). Row t: obs x_t, the action taken in it, the reward and done that
    followed; obs has T+1 rows (x_T bootstraps). Episodes that ended in the unroll: return, length, step t."""
    obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
    max_eps = T * n
    return {
        "obs": ((T + 1, n, *obs_space.shape), obs_dtype),
        "action": ((T, n), torch.int64),
        "logits": ((T, n, n_actions), torch.float32),  # behaviour policy mu
        "value": ((T, n), torch.float32),  # behaviour values V(x_t) (CLEAR's value cloning, agents/clear.py)
        "reward": ((T, n), torch.float32),  # scaled (+ gamma V(final obs) at time-limit truncations)
        "raw_reward": ((T, n), torch.float32),
        "done": ((T, n), torch.bool),
        "epoch": ((), torch.int64),  # switch epoch (the learner's switch count) the unroll came from
        "regime": ((), torch.int64),  # index in session.regimes (-1: not a curriculum regime)
        "version": ((), torch.int64),  # weight version of the behaviour policy: the learner updates behind it
        "actor": ((), torch.int64),
        "ep_count": ((), torch.int64),
        "ep_return": ((max_eps,), torch.float64),
        "ep_length": ((max_eps,), torch.int64),
        "ep_t": ((max_eps,), torch.int64),
    }


def make_buffers(num_buffers: int, T: int, n: int, obs_space, n_actions: int) -> dict[str, torch.Tensor]:
    """Shared-memory unroll slots (the process backend): `num_buffers` unrolls of `unroll_specs`."""
    return {k: torch.zeros((num_buffers, *shape), dtype=dtype).share_memory_()
            for k, (shape, dtype) in unroll_specs(T, n, obs_space, n_actions).items()}


ACTOR_STATS = ("env_s", "act_s", "wait_s", "unrolls")


class Unroller:
    """What an actor plays unrolls with, whatever runs it (an actor process here, a Ray actor in
    agents/impala_ray.py): `n` envs, a CPU copy of the policy, the reward scaler. `start_step` seeds torch's sampling
    and the envs' first reset."""

    def __init__(self, index: int, args: Args, settings: EnvSettings, modification: str, start_step: int, n: int,
                 scaler_row: Optional[Sequence[float]] = None, make_agent_fn=None):
        self.index, self.args, self.T = index, args, args.unroll_length
        # in the actor's process: MinAtar's games batched (the same games, several times faster), others one by one
        self.envs = make_vector_env(settings, n, modification, vector_env="batched" if uses_batched(settings, "auto")
                                    else "sync")
        self.agent = (make_agent_fn or make_agent)(self.envs.single_observation_space,
                                                   int(self.envs.single_action_space.n), args)
        self.weights = self.agent.state_dict()  # copy published weights into these
        torch.manual_seed(args.seed * 7919 + 104729 * (index + 1) + start_step)
        self.scaler = RewardScaler(args.reward_scaling, n, args.gamma)
        resumed = state_from_row(list(scaler_row), args.reward_scaling) if scaler_row is not None else None
        if resumed is not None:  # the running statistics of this actor's reward scaler
            self.scaler.load_state_dict(resumed)
        self.next_obs, _ = self.envs.reset(seed=args.seed + start_step + index * n)

    def switch(self, modification: str, step: int) -> None:
        """A regime switch, in place, at this unroll boundary (the episodes in progress are cut)."""
        # TEST HOOKS (continual.testing.faults) of the actors: they fire inside spawned processes, out of a patch's reach
        inject("actor_switch", self.index)  # die while switching
        self.next_obs, _ = self.envs.switch(modification, step)
        self.scaler.episodes_cut()

    def play(self, out: dict[str, np.ndarray], stop: Callable[[], bool] = lambda: False) -> Optional[tuple[int, float]]:
        """One unroll of T steps of every env into `out` (the arrays of `unroll_specs` but the scalars); returns
        (episodes ended, seconds in env.step), or None when `stop()` cut it short."""
        obs_b, act_b, logit_b, value_b = out["obs"], out["action"], out["logits"], out["value"]
        rew_b, raw_b, done_b = out["reward"], out["raw_reward"], out["done"]
        n_eps, env_s, agent, args = 0, 0.0, self.agent, self.args
        obs_b[0] = self.next_obs
        for t in range(self.T):
            with torch.no_grad():
                logits, value = logits_and_values(agent, torch.from_numpy(obs_b[t]))
                action = networks.draw(F.softmax(logits, -1))
            t_env = time.time()
            self.next_obs, reward, terminations, truncations, infos = self.envs.step(action.numpy())
            env_s += time.time() - t_env
            inject("actor_step", self.index)  # TEST HOOK: die in the middle of an unroll
            done = np.logical_or(terminations, truncations)
            scaled = self.scaler(reward, done)
            cut = np.flatnonzero(truncations & ~terminations)
            if len(cut):  # time limit: bootstrap from the value of the observation the episode ended on
                final = torch.as_tensor(np.stack([infos["final_obs"][i] for i in cut]))
                with torch.no_grad():
                    scaled[cut] += args.gamma * logits_and_values(agent, final)[1].flatten().numpy()
            act_b[t], logit_b[t], value_b[t] = action.numpy(), logits.numpy(), value.numpy()
            rew_b[t], raw_b[t], done_b[t] = scaled, reward, done
            obs_b[t + 1] = self.next_obs
            for _, ep_return, ep_length in episode_stats(infos):
                out["ep_return"][n_eps], out["ep_length"][n_eps], out["ep_t"][n_eps] = ep_return, ep_length, t
                n_eps += 1
            if stop():
                return None
        return n_eps, env_s

    def scaler_row(self) -> Optional[list[float]]:
        """The reward scaler's running statistics as one row (None: nothing to keep)."""
        return state_to_row(self.scaler.state_dict()) if self.scaler.mode == "normalize" else None

    def close(self) -> None:
        self.envs.close()


def actor_main(index: int, args: Args, settings: EnvSettings, modification: str, epoch: int, regime: int,
               start_step: int, n: int, buffers: dict, shared_weights: dict, seqlock: torch.Tensor,
               weights_version: torch.Tensor, stats: torch.Tensor, scaler_state: torch.Tensor, conn,
               stop: torch.Tensor, make_agent_fn=None) -> None:
    """One actor process: fill free slots with unrolls (`Unroller`) until stopped.

    `conn` is this actor's end of its pipe to the learner: ("slot", s) and ("switch", ...) come in, ("full", s) and
    ("error", line, traceback) go out. `stop` is a shared flag only the learner writes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the learner stops us
    torch.set_num_threads(1)
    learner = mp.parent_process()  # the learner (not the forkserver): its sentinel closes when it dies
    stop = stop.numpy()
    free: deque[int] = deque()  # slots the learner gave us
    unroller = None
    try:
        unroller = Unroller(index, args, settings, modification, start_step, n, scaler_state[index].tolist(),
                            make_agent_fn)
        local_seq, local_version = -1, -1
        view = {k: v.numpy() for k, v in buffers.items()}
        env_s = act_s = wait_s = 0.0

        while not stop[0]:
            # 1. the learner's messages in the order sent: free slots, and regime switches applied (in place) at this
            #    unroll boundary; with no free slot, wait for one (waking up now and then: stop flag, learner gone)
            t0 = time.time()
            while True:
                while conn.poll():
                    message = conn.recv()  # EOFError: the learner is gone
                    if message[0] == "slot":
                        free.append(message[1])
                        continue
                    _, epoch, regime, modification, step = message
                    unroller.switch(modification, step)
                if free or stop[0]:
                    break
                inject("actor_wait", index)  # TEST HOOK: die while waiting for work
                wait([conn, learner.sentinel], timeout=POLL_S)
            if stop[0]:
                break
            slot = free.popleft()
            t1 = time.time()
            wait_s += t1 - t0

            # 2. fresh weights (seqlock: the counter is odd while the learner writes)
            v = int(seqlock[0])
            if v != local_seq and v % 2 == 0:
                for k, t in unroller.weights.items():
                    t.copy_(shared_weights[k])
                    inject("actor_weights", index)  # TEST HOOK: die while copying the weights
                version = int(weights_version[0])
                if int(seqlock[0]) == v:
                    local_seq, local_version = v, version

            # 3. the unroll
            played = unroller.play({k: view[k][slot] for k in view if view[k].ndim > 1}, lambda: bool(stop[0]))
            if played is not None:
                for k, value in (("epoch", epoch), ("regime", regime), ("version", local_version),
                                 ("actor", index), ("ep_count", played[0])):
                    view[k][slot] = value
                env_s += played[1]
                row = unroller.scaler_row()
                if row is not None:
                    scaler_state[index] = torch.tensor(row, dtype=torch.float64)
                conn.send(("full", slot))
            act_s += time.time() - t1
            stats[index] = torch.tensor([env_s, act_s - env_s, wait_s, float(stats[index, 3]) + 1], dtype=torch.float64)
    except Exception as e:  # reported by the learner in one line; the traceback goes to the run directory
        if isinstance(e, (EOFError, ConnectionError)) and not learner.is_alive():
            return  # the learner is gone: nobody to report to
        where = traceback.extract_tb(e.__traceback__)[-1]
        line = f"{type(e).__name__}: {e} ({os.path.basename(where.filename)}:{where.lineno} in {where.name})"
        with contextlib.suppress(OSError):  # the learner may be gone too
            conn.send(("error", " ".join(line.split()), traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if unroller is not None:
            unroller.close()


class RolloutActor:
    """One Ray actor (`--actor_backend ray`; agents/impala_ray.py starts them and sends the requests): an `Unroller`,
    built at the first request (that request's regime, seed step and reward scaler: a restarted actor starts where
    the run is), and one unroll per request. A request: `published` (the learner's publication count) and `version`
    of the weights, `epoch`, `regime`, `modification` and `switch_step` of the current regime, `seed_step`,
    `scaler_row`; `weights`: [the object ref of that publication] (in a list: Ray leaves the fetch to us, once per
    publication)."""

    def __init__(self, index: int, args: Args, settings: EnvSettings, n: int, make_agent_path: str):
        with contextlib.suppress(ValueError):  # Ctrl-C reaches the process group: the learner stops us
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(1)
        self.index, self.args, self.settings, self.n = index, args, settings, n
        self.make_agent_fn = impala_ray.resolve(make_agent_path)
        self.unroller: Optional[Unroller] = None
        self.epoch = self.published = self.version = None
        self.idle_since: Optional[float] = None

    def where(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    def unroll(self, request: dict, weights: list) -> dict:
        import ray

        t0 = time.time()
        wait_s = t0 - self.idle_since if self.idle_since is not None else 0.0
        if self.unroller is None:
            self.unroller = Unroller(self.index, self.args, self.settings, request["modification"],
                                     request["seed_step"], self.n, request["scaler_row"], self.make_agent_fn)
            self.epoch = request["epoch"]
        elif request["epoch"] != self.epoch:
            self.unroller.switch(request["modification"], request["switch_step"])
            self.epoch = request["epoch"]
        if request["published"] != self.published:
            state = ray.get(weights[0], timeout=impala_ray.GET_TIMEOUT_S)
            with torch.no_grad():
                for k, t in self.unroller.weights.items():
                    t.copy_(torch.as_tensor(state[k]))
            self.published, self.version = request["published"], request["version"]
        envs = self.unroller.envs
        specs = unroll_specs(self.args.unroll_length, self.n, envs.single_observation_space,
                             int(envs.single_action_space.n))
        arrays = {k: torch.zeros(shape, dtype=dtype).numpy() for k, (shape, dtype) in specs.items() if len(shape)}
        n_eps, env_s = self.unroller.play(arrays)
        self.idle_since = time.time()
        return {"arrays": arrays, "scalars": {"epoch": request["epoch"], "regime": request["regime"],
                                              "version": self.version, "actor": self.index, "ep_count": n_eps},
                "scaler_row": self.unroller.scaler_row(),
                # env stepping, the rest (inference, weights, switches), waiting for this request
                "stats": (env_s, self.idle_since - t0 - env_s, wait_s)}


class ActorFleet:
    """The actor processes (`--actor_backend process`) with their shared buffers, weights and pipes.

    What the learner calls on a fleet (agents/impala_ray.py's `RayActorFleet` has the same methods): `start`;
    `publish(agent, version)` the weights after `version` updates (every `--broadcast_interval` updates, and always
    with `force`); `switch(new, step)` (what `session.maybe_switch` calls) broadcasts a regime to every actor;
    `get_batch(count)` waits for full unrolls and raises ActorFailure when an actor died; `stats_delta` the actors'
    time and other scalars since the last call; `scaler_states` / `load_scaler_states` their reward scalers;
    `describe` who runs where (`<run>/actors.json`); `close` stops every actor. Actor i owns slots [i k, (i+1) k):
    the learner hands a slot back to its owner once it copied the unroll out, so no slot pool is shared between
    processes.
    """

    def __init__(self, args: Args, settings: EnvSettings, session: RunSession, obs_space, n_actions: int,
                 make_agent_fn=None):
        self.args, self.settings, self.session = args, settings, session
        self.make_agent_fn = make_agent_fn  # None: make_agent (a variant's model, agents/pnc.py, otherwise)
        self.n = args.num_envs // args.num_actors
        # a batch never waits for a slot: with k >= B/A + 1 slots each, the actors can fill B while each fills one more
        self.slots_per_actor = max(2, -(-args.batch_size // args.num_actors) + 1)
        self.num_buffers = self.slots_per_actor * args.num_actors
        self.modification = session.modification
        self.epoch = session.switches  # switch epochs keep counting across resumes
        self.epoch_modification = {self.epoch: session.modification}
        self.ctx = start_forkserver(settings)
        self.buffers = make_buffers(self.num_buffers, args.unroll_length, self.n, obs_space, n_actions)
        # the actors' source of weights
        self.shared_weights = (make_agent_fn or make_agent)(obs_space, n_actions, args).share_memory().state_dict()
        self.seqlock = torch.zeros(1, dtype=torch.int64).share_memory_()  # odd while the learner writes
        self.weights_version = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.stats = torch.zeros((args.num_actors, len(ACTOR_STATS)), dtype=torch.float64).share_memory_()
        self.scaler_state = torch.zeros((args.num_actors, 3 + self.n), dtype=torch.float64).share_memory_()
        self.stop = torch.zeros(1, dtype=torch.uint8).share_memory_()  # written by the learner only
        self.processes: list = []
        self.conns: list = []  # the learner's end of each actor's pipe
        self.full: list[int] = []  # slots with an unroll, in arrival order
        self.errors: dict[int, str] = {}  # actor index -> its one-line error
        self._last_stats = np.zeros((args.num_actors, len(ACTOR_STATS)))
        self._last_unroll = time.time()

    def start(self) -> None:
        for i in range(self.args.num_actors):
            # only actor 0's first env records videos (one file per episode, no name clashes)
            settings = self.settings if i == 0 else dataclasses.replace(self.settings, video_dir=None)
            conn, actor_end = self.ctx.Pipe()
            p = self.ctx.Process(
                target=actor_main, name=f"actor-{i}", daemon=True,
                args=(i, self.args, settings, self.modification, self.epoch,
                      self.session.regime_index(self.modification), self.session.global_step, self.n, self.buffers,
                      self.shared_weights, self.seqlock, self.weights_version, self.stats, self.scaler_state,
                      actor_end, self.stop, self.make_agent_fn))
            p.start()
            actor_end.close()  # the actor holds the only copy: its death closes the pipe
            self.processes.append(p)
            self.conns.append(conn)
            for slot in range(i * self.slots_per_actor, (i + 1) * self.slots_per_actor):
                self.send(i, ("slot", slot))
        self._last_unroll = time.time()

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def describe(self) -> dict:
        return {"backend": "process", "actors": self.pids()}

    def local_actors(self) -> int:
        """Actors on the learner's machine (all of them here)."""
        return len(self.processes)

    def send(self, i: int, message: tuple) -> None:
        """A few bytes to actor i (never blocks: the pipe buffer holds far more than the messages in flight)."""
        try:
            self.conns[i].send(message)
        except OSError:
            pass  # the actor is dead: get_batch reports it (its sentinel)

    # --- the curriculum's view: an env-like object with `.modification` and `.switch` ---------------------------------
    def switch(self, modification: str, step: int = 0, seed: Optional[int] = None):
        # `seed` (the env-reset seed of a switch) is not used: actors run asynchronously, their games are not replayed
        self.epoch += 1
        self.modification = modification
        self.epoch_modification[self.epoch] = modification
        for i in range(len(self.conns)):
            # TEST HOOK (continual.testing.faults): an actor dies mid-broadcast (the tests run this file as __main__, out
            # of reach of a patch made before it starts)
            kill_at("broadcast_switch", self.processes)
            self.send(i, ("switch", self.epoch, self.session.regime_index(modification), modification, step))
        return None, {}

    # --- weights -------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def publish(self, agent: nn.Module, version: int, force: bool = False) -> None:
        """The learner's weights after `version` updates, every --broadcast_interval updates (`force`: now)."""
        if not (force or version % self.args.broadcast_interval == 0):
            return
        self.seqlock += 1  # odd: writing
        for k, t in folded_state_dict(agent).items():  # --plasticity_injection: the actors' heads stay one layer
            self.shared_weights[k].copy_(t)
            # TEST HOOK (continual.testing.faults): an actor dies mid-publish, between two tensor copies (no seam to patch;
            # the tests run this file as __main__, out of reach of a patch made before it starts)
            kill_at("publish", self.processes)
        self.weights_version[0] = version
        self.seqlock += 1

    # --- failures ------------------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ActorFailure naming the first actor that is no longer running."""
        for i, p in enumerate(self.processes):
            code = p.exitcode
            if code is None:
                continue
            self.receive(i)  # its last words, if any are still in the pipe
            if i in self.errors:
                raise ActorFailure(f"actor {i} (pid {p.pid}) failed: {self.errors[i]}")
            what = "died" if code != 0 else "exited unexpectedly"
            raise ActorFailure(f"actor {i} (pid {p.pid}) {what}: exit code {code}")

    def receive(self, i: int) -> None:
        """Every message actor i has sent so far: full slots, or its error (traceback to the run directory)."""
        conn = self.conns[i]
        try:
            while conn.poll():
                message = conn.recv()
                if message[0] == "full":
                    self.full.append(message[1])
                    self._last_unroll = time.time()
                else:
                    _, line, tb = message
                    path = os.path.join(self.session.run_dir, f"actor{i}_traceback.txt")
                    with open(path, "w") as f:
                        f.write(tb)
                    self.errors[i] = f"{line}; traceback in {path}"
        except (EOFError, OSError):  # the actor is gone (its exit code is reported by check)
            self.processes[i].join(timeout=JOIN_TIMEOUT_S)
            if self.processes[i].exitcode is None:
                raise ActorFailure(f"actor {i} (pid {self.processes[i].pid}) closed its pipe") from None

    # --- data ----------------------------------------------------------------------------------------------------------
    def get_batch(self, count: int) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Wait for `count` full unrolls (watching every actor's pipe and sentinel); copy them out of shared memory
        and give the slots back to their actors at once."""
        self.check()
        sentinels = {p.sentinel for p in self.processes}
        while len(self.full) < count:
            ready = wait([*self.conns, *sentinels], timeout=POLL_S)
            for i, conn in enumerate(self.conns):
                if conn in ready:
                    self.receive(i)
            if sentinels.intersection(ready) or not ready:
                self.check()
            if time.time() - self._last_unroll > STALL_TIMEOUT_S:
                raise ActorFailure(f"no unroll from any actor for {STALL_TIMEOUT_S:.0f} s (actor pids {self.pids()})")
        slots, self.full = self.full[:count], self.full[count:]
        batch = {k: v[slots] for k, v in self.buffers.items()}  # fancy indexing copies
        for s in slots:
            self.send(s // self.slots_per_actor, ("slot", s))
        return batch, slots

    def stats_delta(self) -> dict[str, float]:
        """Actor time since the last call, summed over actors (env stepping, inference + bookkeeping, waiting for a
        free slot), and the share of it spent busy."""
        now = self.stats.numpy().copy()
        d = (now - self._last_stats).sum(0)
        self._last_stats = now
        env_s, act_s, wait_s = float(d[0]), float(d[1]), float(d[2])
        busy = env_s + act_s
        return {"time/actor_env_s": env_s, "time/actor_act_s": act_s, "time/actor_wait_s": wait_s,
                "time/actor_utilisation": busy / (busy + wait_s) if busy + wait_s > 0 else float("nan")}

    def scaler_states(self) -> list[dict]:
        return [state_from_row(row, self.args.reward_scaling) for row in self.scaler_state.tolist()]

    def load_scaler_states(self, states: list) -> None:
        """The actors' reward scalers as a checkpoint had them (before `start`: each actor reads its row once)."""
        for i, st in enumerate(states):
            if st is not None:
                self.scaler_state[i] = torch.tensor(state_to_row(st), dtype=torch.float64)

    # --- shutdown ------------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop flag, join with a timeout, then SIGTERM, then SIGKILL: no actor outlives the learner."""
        self.stop[0] = 1
        stop_processes(self.processes, join_timeout=JOIN_TIMEOUT_S, kill_timeout=2.0)
        for conn in self.conns:
            conn.close()


def start_forkserver(settings: EnvSettings):
    """Actors fork from a server process that imported torch and the env stack once (a fork of the learner would
    copy its threads; spawn would re-import everything per actor). Started early, its imports overlap the learner's."""
    ctx = mp_context(settings.atari, extra=["agents.ppo"])
    forkserver.ensure_running()
    return ctx


def make_fleet(args: Args, settings: EnvSettings, session: RunSession, obs_space, n_actions: int, make_agent_fn):
    """The actors of `--actor_backend`: processes on this machine (`ActorFleet`), or `RolloutActor`s on Ray, on this
    machine or a cluster (agents/impala_ray.py)."""
    if args.actor_backend == "process":
        return ActorFleet(args, settings, session, obs_space, n_actions, make_agent_fn)
    specs = unroll_specs(args.unroll_length, args.num_envs // args.num_actors, obs_space, n_actions)
    unroll_bytes = sum(int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
                       for shape, dtype in specs.values())
    weights = (make_agent_fn or make_agent)(obs_space, n_actions, args).state_dict()  # (as ActorFleet: one model)
    return impala_ray.RayActorFleet(args, settings, session, "agents.impala:RolloutActor",
                                    impala_ray.factory_path(make_agent_fn or make_agent, args.architecture),
                                    unroll_bytes, sum(t.numel() * t.element_size() for t in weights.values()))


def probe_spaces(settings: EnvSettings, modification: str):
    """Observation space and number of actions, from one env built and closed in the learner."""
    env = make_env(dataclasses.replace(settings, video_dir=None), 0, modification)()
    try:
        return env.observation_space, int(env.action_space.n)
    finally:
        env.close()


# --------------------------------------------------------------------------------------------------------------------
# learner
# --------------------------------------------------------------------------------------------------------------------


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None, make_agent_fn=make_agent,
          make_extension: Optional[Callable[..., Extension]] = None) -> str:
    """`make_agent_fn` builds the model (PNC's two columns), `make_extension(args, session, agent, optimizer,
    obs_space, n_actions, device)` the variant's `Extension` (CLEAR's replay, P&C), called in every update after
    IMPALA's continual methods: `extend_batch` (through `update_batch`) may append columns to the time-major batch,
    `loss` gives the loss to minimise, `after_update` runs after the optimizer step."""
    envs_per_actor = args.num_envs // args.num_actors
    T = args.unroll_length
    steps_per_update = args.batch_size * T * envs_per_actor
    session = start_run(args, curriculum, resume_state, granularity=steps_per_update)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    settings = EnvSettings.from_args(args, video_dir=session.video_dir, regimes=session.regimes,
                                     start_step=session.global_step)
    threads = torch.get_num_threads()
    session.closing(lambda: torch.set_num_threads(threads))
    if device.type == "cpu":  # leave a core to each actor: oversubscribed OpenMP threads slow the learner 10-100x
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - args.num_actors))

    # a signal that reached the actors too (SIGTERM to the process group) is an interruption, not a failure
    with session.running(interrupted_by=(ActorFailure,)):
        if args.actor_backend == "process":
            start_forkserver(settings)
        obs_space, n_actions = probe_spaces(settings, session.modification)
        agent = make_agent_fn(obs_space, n_actions, args).to(device)  # CNNs come channels-last (networks.Agent)
        optimizer = optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=args.rmsprop_alpha,
                                  eps=args.rmsprop_eps, momentum=0.0)
        # what a checkpoint holds: the model and optimizer (add_continual registers them; a resumed run loads each
        # now). Continual behaviour: EWC, plasticity methods, the variant's (CLEAR, P&C), evaluation
        variant = [make_extension(args, session, agent, optimizer, obs_space, n_actions, device)] if make_extension \
            else []
        ext = add_continual(session, agent, optimizer, CONTINUAL, make_agent_fn, (obs_space, n_actions),
                            device=device, last=variant)
        # the actors (--actor_backend: processes, or Ray actors on this machine or a cluster), one interface
        fleet = session.closing(make_fleet(args, settings, session, obs_space, n_actions, make_agent_fn))
        session.register("reward_scalers", fleet.scaler_states, fleet.load_scaler_states, optional=True)
        # weights versions count the learner's updates (a resumed run goes on counting)
        fleet.publish(agent, session.global_step // steps_per_update, force=True)

        # TRY NOT TO MODIFY: start the actors
        fleet.start()
        if device.type == "cpu" and fleet.local_actors() != args.num_actors:  # Ray actors on other machines
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - fleet.local_actors()))
        atomic_write_json(os.path.join(session.run_dir, "actors.json"), {"learner": os.getpid(), **fleet.describe()})
        print(f"learner pid {os.getpid()}, actor pids {fleet.pids()}; {args.num_actors} actors x {envs_per_actor} envs, "
              f"{steps_per_update} steps per update", flush=True)
        global_step = session.global_step

        for iteration in session.iterations():  # resumed: RNGs as the checkpoint had them
            # wait for batch_size unrolls (raises ActorFailure if an actor died)
            t_iter = time.time()
            batch, _ = fleet.get_batch(args.batch_size)
            wait_s = time.time() - t_iter

            # the curriculum, asked at the learner's step count; a switch reaches the actors at their next unroll
            switches = session.switches
            session.maybe_switch(fleet)
            if session.switches != switches:  # after-switch hooks (shrink & perturb, P&C) may have changed the weights
                fleet.publish(agent, iteration - 1, force=True)

            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / session.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ALGO LOGIC: [B, T(+1), n, ...] slots -> [T(+1), B*n, ...] time-major
            t_learn = time.time()
            B = args.batch_size * envs_per_actor

            def time_major(x: torch.Tensor) -> torch.Tensor:
                return x.transpose(0, 1).reshape(x.shape[1], B, *x.shape[3:]).to(device)

            obs = time_major(batch["obs"])
            actions, behaviour_logits = time_major(batch["action"]), time_major(batch["logits"])
            rewards, dones = time_major(batch["reward"]), time_major(batch["done"])

            # the data trained on goes to the extensions (the monitor's probe, EWC's Fisher samples: the last unrolls
            # of a regime, batch-major), which may extend it (CLEAR: replayed unrolls join as extra columns, B grows)
            tm = {"obs": obs, "action": actions, "logits": behaviour_logits, "reward": rewards, "done": dones}
            tm = ext.update_batch(agent, tm, rollout=batch, observed={
                "obs": obs[:T], "obs_shape": obs_space.shape, "rows": {k: v.transpose(0, 1) for k, v in tm.items()}})
            obs, actions, behaviour_logits, rewards, dones = (tm[k] for k in ("obs", "action", "logits", "reward",
                                                                             "done"))
            B = obs.shape[1]
            out = vtrace_losses(agent, obs, actions, behaviour_logits, rewards, dones, args)
            logits, logp, values, vt, pg_loss, v_loss = out.logits, out.logp, out.values, out.vt, out.pg_loss, out.v_loss
            action_logp, behaviour_logp = out.action_logp, out.behaviour_logp
            entropy_loss = -(logp.exp() * logp).sum()
            vtrace_loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy_loss
            # EWC's penalty, L2 / L2 Init / Parseval, CLEAR's cloning; P&C's compress phase replaces it
            loss = ext.loss(vtrace_loss, agent, {"obs": obs[:T], "logits": logits, "values": values})
            check_losses(global_step, value_loss=v_loss.detach(), policy_loss=pg_loss.detach(),
                         entropy=entropy_loss.detach(), combined=vtrace_loss)

            optimizer.zero_grad()
            loss.backward()
            ext.before_step()  # gradient norms (diagnostics)
            grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.grad_clip_norm())
            optimizer.step()
            ext.after_step(optimizer)  # NaP's norms
            # ReDo, layer resets, when due (before the actors get the weights); CLEAR: the new unrolls enter its buffer
            ext.after_update({"obs": obs[:T], "step": global_step + steps_per_update})
            check_parameters(agent, global_step)
            fleet.publish(agent, iteration)  # every --broadcast_interval updates
            learn_s = time.time() - t_learn

            # TRY NOT TO MODIFY: count the consumed steps, log episodes under the regime of their unroll
            first_step = global_step
            global_step += steps_per_update
            session.global_step = global_step
            versions, epochs = batch["version"].tolist(), batch["epoch"].tolist()
            for j in range(args.batch_size):
                modification = fleet.epoch_modification.get(epochs[j], "")
                for e in range(int(batch["ep_count"][j])):
                    step = first_step + (j * T + int(batch["ep_t"][j, e]) + 1) * envs_per_actor
                    session.episode(float(batch["ep_return"][j, e]), int(batch["ep_length"][j, e]), step,
                                    modification)

            with torch.no_grad():
                y_pred, y_true = values[:T].flatten().cpu().numpy(), vt.vs.flatten().cpu().numpy()
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                approx_kl = (behaviour_logp - action_logp).mean().item()
            iteration_s = time.time() - t_iter
            session.end_iteration(iteration, {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "losses/value_loss": v_loss.item() / (T * B), "losses/policy_loss": pg_loss.item() / (T * B),
                "losses/entropy": entropy_loss.item() / (T * B), "losses/approx_kl": approx_kl,
                "losses/explained_variance": float(explained_var), "losses/grad_norm": float(grad_norm),
                "losses/rho_mean": vt.rhos.mean().item(),
                "losses/rho_clipfrac": (vt.rhos > args.vtrace_rho_bar * (1 + 1e-3)).float().mean().item(),
                # updates between the weights that played an unroll and those it trained (before this update)
                "charts/policy_lag": float(np.mean([iteration - 1 - v for v in versions])),
                "charts/previous_regime_unrolls": float(sum(e != fleet.epoch for e in epochs)),
                "time/learner_wait_s": wait_s, "time/learn_s": learn_s, "time/iteration_s": iteration_s,
                "time/learner_utilisation": learn_s / iteration_s if iteration_s > 0 else float("nan"),
                **fleet.stats_delta(),
            })
    return session.run_dir


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "IMPALA", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
