"""Several seeds of agents/dqn.py's DQN trained in one process: `python agents/dqn_seeds.py --seeds 1 2 3 4 <dqn.py's
flags>`.

At one update per env step (C-CHAIN's Continual MinAtar) part of each update is work around the network's kernels:
Adam's per-parameter calls, batch sampling, the loss check, the backward engine's call, the extension hooks
(docs/benchmarks/dqn-a2c.md). Here K seeds share that work in one update of them all.

Each seed is a whole agents/dqn.py run (`--seed s`): its own RunSession (run directory, config.json with its seed,
metrics.jsonl, TensorBoard, evaluations, checkpoints), its own envs, numpy generator, replay buffer, reward scaler,
exploration coins, C-CHAIN coefficient and records, built in dqn.py's order from its own seed. What is shared:

- the parameters: every seed's online, target and C-CHAIN reference weights stacked into (K, ...) tensors (with
  --fused_adam, a parameter whose size is not a multiple of ALIGNED stays one tensor per seed);
- the update (`update`): dqn.py's loss seed by seed on that seed's slices, with the kernels dqn.QNetwork's modules
  call (`seed_forward`), the losses summed over seeds so that one backward pass gives every seed its own gradient (a
  seed's loss depends on its parameters only), one Adam step over the stacked tensors (Adam is elementwise: K Adams
  with the same step count);
- the replay storage: dqn.ReplayBuffer per seed, its arrays slices of one (K, ...) array per field; each seed draws
  its indices with its own generator (dqn.py's draws), one fancy index gathers every seed's batch.

Stacking the seeds into the kernels themselves (torch.func.vmap, grouped convolutions) was measured no faster on a
CPU, where MinAtar's kernels at batch 32 are compute-bound, and it changes the floats; seed by seed, each seed's run
is dqn.py's bit for bit: tests/test_agents_dqn_seeds.py compares the update with dqn.py's (and its CChain
extension's) and whole MinAtar runs record by record and checkpoint by checkpoint.

The per-seed networks the sessions hold (dqn.py's `q_network`, `target_network`, optimizer, C-CHAIN's reference) are
copies, refreshed from the stacked tensors at the end of every iteration, before the session logs, evaluates and
checkpoints: a seed's checkpoint is a dqn.py checkpoint (python agents/dqn.py --resume <its run> continues that seed
alone).

Resuming: `python agents/dqn_seeds.py --resume RUN [RUN ...]` continues, in one process, K runs of one configuration
but for the seed whose newest checkpoints are at one step, each as `agents/dqn.py --resume RUN` continues it alone,
bit for bit; runs at different steps are refused in one line (resume each alone). A group's own checkpoints are at
one step: one --checkpoint_minutes clock for all its seeds, read once an iteration, and a signal stops all at one
step.

Not batched (refused in one line): the plasticity methods and network options, shrink & perturb, the optimizer reset
at switches. The extension hooks dqn.py calls every update
(`loss`, `before_step`, `after_step`, `after_update`) serve only C-CHAIN and the gradient-norm diagnostics once the
refused methods are out: C-CHAIN is batched here (its coefficient and records are each seed's own `CChain`), and the
diagnostics read the gradients of each iteration's last update, as dqn.py's log does. time/learn_s and time/act_s
are the process's, divided by K.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
from typing import Optional, Sequence

if __package__ in (None, ""):  # `python agents/dqn_seeds.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

from agents.dqn import (
    CONTINUAL,
    RegimeStart,
    ReplayBuffer,
    checkpoint_replay,
    linear_schedule,
    make_agent,
    make_replay,
    td_target,
)
from continual.config.args import Args
from continual.config.loading import Curriculum, load_json_file
from continual.config.validation import check_batched_across_seeds
from continual.envs.vector import EnvSettings, episode_stats, make_vector_env
from continual.errors import UserError, exit_on_user_error
from continual.methods import add_continual
from continual.plasticity.c_chain import CChain, q_churn
from continual.plasticity.diagnostics import PlasticityMonitor
from continual.training import checkpoint as ckpt_lib
from continual.training.callbacks import CheckpointCallback
from continual.training.guards import check_losses, check_parameters
from continual.training.rewards import RewardScaler
from continual.training.startup import (
    agent_main,
    default_run_name,
    parse_train_args,
    preflight,
    print_config,
    set_torch_threads,
    start_run,
)

RESUME = ("resume: give the seeds' run directories (--resume RUN [RUN ...]), without --seeds, --run_names or "
          "--configs; one seed also resumes alone with python agents/dqn.py --resume <its run directory>")
# what may differ between the runs of one group: the seed, and what names the run (its own config file, its name)
PER_SEED = ("seed", "run_name", "config", "resume")


def check_supported(args: Args, seeds: Sequence[int], run_names: Optional[Sequence[str]]) -> None:
    """Bad input, one line, before any run directory exists."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"seeds: give distinct seeds (got {list(seeds)})")
    if run_names is not None and len(run_names) != len(seeds):
        raise UserError(f"run_names: one per seed ({len(seeds)} seeds, {len(run_names)} names)")


def seed_args(args: Args, seed: int, run_name: Optional[str], config: Optional[str] = None) -> Args:
    """What `python agents/dqn.py --seed <seed> --run_name <run_name>` would run with (None: dqn.py's default name);
    `config`: the seed's own config file (recorded in its config.json, as its own dqn.py run records it)."""
    out = dataclasses.replace(args, seed=seed, config=config or args.config)
    out.run_name = run_name if run_name is not None else default_run_name(out)
    return out


def check_configs(args: Args, seeds: Sequence[int], configs: Optional[Sequence[str]]) -> None:
    """--configs (the launcher's entries, one config file per seed): each the --config file but for its seed, so that
    the seed runs what the --config file says and records its own file, as its own run would."""
    if configs is None:
        return
    if len(configs) != len(seeds) or args.config is None:
        raise UserError(f"configs: one per seed ({len(seeds)} seeds, {len(configs)} configs), with --config")

    def but_seed(config: dict) -> dict:
        return {k: v for k, v in config.items() if k != "seed"}
    base = but_seed(load_json_file(args.config, "config"))
    for seed, path in zip(seeds, configs):
        config = load_json_file(path, "config")
        if but_seed(config) != base or config.get("seed", seed) != seed:
            raise UserError(f"configs: {path!r} is not {args.config!r} with seed {seed}")


class StackedReplay:
    """K of dqn.py's ReplayBuffer whose arrays are the slices of one (K, ...) array per field: each seed stores and
    samples through its own buffer (its own generator's draws), one fancy index gathers every seed's batch."""

    FIELDS = ("frames", "actions", "rewards", "terminated", "valid")

    def __init__(self, buffers: Sequence[ReplayBuffer]):
        self.buffers = list(buffers)
        for name in self.FIELDS:
            one = getattr(self.buffers[0], name)
            stacked = np.zeros((len(self.buffers),) + one.shape, one.dtype)  # mapped lazily, as dqn.py's
            for k, rb in enumerate(self.buffers):
                if rb.added:  # what a resumed seed's checkpoint gave its buffer
                    stacked[k] = getattr(rb, name)
                setattr(rb, name, stacked[k])
            setattr(self, name, stacked)
        rb = self.buffers[0]
        self.k, self.n, self.obs_shape = rb.k, rb.n, rb.obs_shape
        self.row = np.arange(len(self.buffers))[:, None]

    def sample_indices(self, batch_size: int, rngs: Sequence[np.random.Generator]) -> tuple[np.ndarray, np.ndarray]:
        """(env, slot) arrays of shape (K, batch_size), seed k's drawn by ReplayBuffer.sample_indices from rngs[k]."""
        drawn = [rb.sample_indices(batch_size, rng) for rb, rng in zip(self.buffers, rngs)]
        return np.stack([e for e, _ in drawn]), np.stack([s for _, s in drawn])

    def _window(self, envs: np.ndarray, slots: np.ndarray, last: int) -> np.ndarray:
        return self.frames[self.row[:, :, None], envs[:, :, None],
                           (slots[:, :, None] + np.arange(-self.k, last)) % self.n]

    def gather(self, envs: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, ...]:
        """ReplayBuffer.gather for every seed at once: (obs, actions, rewards, terminated, next_obs), (K, B, ...)."""
        window = self._window(envs, slots, 1)
        shape = envs.shape + self.obs_shape
        at = (self.row, envs, slots)
        read = self.buffers[0].read
        return (read(window[:, :, :-1].reshape(shape)), self.actions[at], self.rewards[at], self.terminated[at],
                read(window[:, :, 1:].reshape(shape)))

    def gather_obs(self, envs: np.ndarray, slots: np.ndarray) -> np.ndarray:
        return self.buffers[0].read(self._window(envs, slots, 0).reshape(envs.shape + self.obs_shape))


# fused Adam runs a vector loop over each tensor and a scalar loop over its last numel % (vector width) elements, which
# round differently: a parameter whose per-seed size is a multiple of this (every vector width up to AVX-512's, 4x
# unrolled) is stacked, so that each seed's elements take the loop they take in dqn.py; the others (MinAtar's 6 head
# biases) stay one tensor per seed, in the same single Adam call
ALIGNED = 64


def stack(networks: Sequence[torch.nn.Module], split_unaligned: bool = False) -> dict[str, object]:
    """name -> the networks' parameters as one (K, ...) tensor, seed k's at index k; `split_unaligned`: a parameter
    whose size is not a multiple of ALIGNED as a list of K tensors instead. Leaves of their own, detached from the
    networks."""
    out: dict[str, object] = {}
    for name, p in networks[0].named_parameters():
        each = [dict(n.named_parameters())[name].detach().clone() for n in networks]
        out[name] = each if split_unaligned and p.numel() % ALIGNED else torch.stack(each)
    return out


def leaves(params: dict[str, object]) -> list[torch.Tensor]:
    return [t for v in params.values() for t in (v if isinstance(v, list) else [v])]


def seed_slices(params: dict[str, object], num_seeds: int) -> list[dict[str, torch.Tensor]]:
    """Each seed's parameters as views: one unbind per stacked tensor, whose backward stacks the seeds' gradients
    (an index per seed would add K dense (K, ...) gradients)."""
    cols = {name: (v if isinstance(v, list) else v.unbind(0)) for name, v in params.items()}
    return [{name: c[k] for name, c in cols.items()} for k in range(num_seeds)]


def seed_forward(network: torch.nn.Module):
    """f(params, x): dqn.QNetwork.forward with the parameters in `params` (name -> tensor), calling the kernels its
    modules call (F.conv2d, F.linear with their settings), so each seed computes what its own network computes."""
    layers = list(network.network.named_children())
    scale = network.obs_scale

    def apply(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x if scale == 1.0 else x * scale
        for name, m in layers:
            if isinstance(m, torch.nn.Conv2d):
                x = F.conv2d(x, params[f"network.{name}.weight"], params[f"network.{name}.bias"], m.stride, m.padding,
                             m.dilation, m.groups)
            elif isinstance(m, torch.nn.Linear):
                x = F.linear(x, params[f"network.{name}.weight"], params[f"network.{name}.bias"])
            else:  # ReLU, Flatten: no parameters (the plasticity options that add some are refused)
                x = m(x)
        return F.linear(x, params["q_head.weight"], params["q_head.bias"])
    return apply


def seed_params(stacked: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    return {name: v[k] for name, v in stacked.items()}


@torch.no_grad()
def assign(dst: dict[str, torch.Tensor], fn) -> None:
    """dst[name][k] = fn(name, k) for every seed k: the target copy, the C-CHAIN reference."""
    for name, v in dst.items():
        for k in range(len(v)):
            v[k].copy_(fn(name, k))


@torch.no_grad()
def copy_into(params: dict[str, object], k: int, network: torch.nn.Module) -> None:
    """Seed k's parameters into its own network."""
    for name, p in network.named_parameters():
        p.copy_(params[name][k])


def stacked_optimizer_state(stacked_opt: optim.Optimizer, params: dict[str, object],
                            seeds: Sequence[tuple[optim.Optimizer, torch.nn.Module]]) -> None:
    """`seed_optimizer_state` the other way (a resumed group): every seed's Adam state, stacked into the shared
    Adam's (the step count, one for all, is the first seed's: check_resumable_together made them equal)."""
    for name, v in params.items():
        states = [opt.state.get(dict(net.named_parameters())[name]) for opt, net in seeds]
        if not all(states):
            continue
        if isinstance(v, list):
            for t, state in zip(v, states):
                stacked_opt.state[t] = {key: x.detach().clone() for key, x in state.items()}
        else:
            stacked_opt.state[v] = {key: (states[0][key].detach().clone() if key == "step"
                                          else torch.stack([st[key] for st in states]))
                                    for key in states[0]}
    stacked_opt.param_groups[0]["lr"] = seeds[0][0].param_groups[0]["lr"]


def seed_optimizer_state(stacked_opt: optim.Optimizer, params: dict[str, object], k: int, opt: optim.Optimizer,
                         network: torch.nn.Module) -> None:
    """Seed k's Adam state (its slice of the shared Adam's moments, the shared step count) into its own optimizer,
    which then holds what dqn.py's would: its checkpoints are dqn.py's."""
    for name, p in network.named_parameters():
        v = params[name]
        stacked = not isinstance(v, list)
        state = stacked_opt.state.get(v if stacked else v[k])
        if state:
            opt.state[p] = {key: (x[k] if stacked and key != "step" else x).detach().clone()
                            for key, x in state.items()}
    opt.param_groups[0]["lr"] = stacked_opt.param_groups[0]["lr"]


@dataclasses.dataclass
class Seed:
    """One seed's run: what dqn.py's train() builds, in its order."""

    args: Args
    session: object
    envs: object
    q_network: torch.nn.Module
    target_network: torch.nn.Module
    optimizer: optim.Optimizer
    rb: ReplayBuffer
    at_switch: RegimeStart
    ext: object
    reward_scaler: RewardScaler
    c_chain: Optional[CChain]
    monitor: PlasticityMonitor
    obs: Optional[np.ndarray] = None


def build_seed(args: Args, curriculum: Curriculum, device: torch.device, iteration_size: int,
               resume_state: Optional[dict] = None) -> Seed:
    """dqn.py's train() up to its loop, for one seed (its globals seeded by start_run: the same networks; resumed:
    every registered state loaded from `resume_state`, as dqn.py --resume loads it)."""
    session = start_run(args, curriculum, resume_state, granularity=iteration_size)
    settings = EnvSettings.from_args(args, video_dir=session.video_dir, regimes=session.regimes,
                                     start_step=session.global_step)
    envs = session.closing(make_vector_env(settings, args.num_envs, session.modification, args.vector_env))
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    q_network = make_agent(obs_space, action_space, args).to(device)
    set_torch_threads(args, q_network.obs_shape)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate,
                           **({"fused": True} if args.fused_adam else {"foreach": True}))
    target_network = make_agent(obs_space, action_space, args).to(device)
    target_network.load_state_dict(q_network.state_dict())
    reward_scaler = RewardScaler(args.reward_scaling, args.num_envs, args.gamma)
    rb = make_replay(args, obs_space)
    at_switch = RegimeStart(args, rb)
    ext = add_continual(session, q_network, optimizer, CONTINUAL, make_agent, (obs_space, action_space),
                        device=device, followers={"target_model": target_network}, last=[at_switch])
    session.register("reward_scaler", reward_scaler.state_dict, reward_scaler.load_state_dict)
    checkpoint_replay(session, rb, args)
    c_chain = next((e for e in ext if isinstance(e, CChain)), None)
    monitor = next(e for e in ext if isinstance(e, PlasticityMonitor))
    seed = Seed(args, session, envs, q_network, target_network, optimizer, rb, at_switch, ext, reward_scaler,
                c_chain, monitor)
    seed.obs, _ = envs.reset(seed=args.seed + session.global_step)
    rb.begin(range(args.num_envs))
    return seed


@contextlib.contextmanager
def all_running(seeds: Sequence[Seed]):
    """Every seed's `session.running()` around the shared loop. A signal stops every seed (each session's handler is
    called); each writes its interrupted checkpoint before the process exits with 128 + the signal number."""
    sessions = [s.session for s in seeds]

    def on_signal(signum, frame):
        for session in sessions:
            session.on_signal(signum, frame)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    @contextlib.contextmanager
    def exit_later(session):
        try:
            with session.running():
                yield
        except SystemExit:  # the signal's exit: after the other seeds have saved too
            if session.stop_signal is None:
                raise
    with contextlib.ExitStack() as stack:
        for session in sessions:
            stack.enter_context(exit_later(session))
        yield
    stopped = [s.stop_signal for s in sessions if s.stop_signal is not None]
    if stopped:
        raise SystemExit(128 + stopped[0])


def check_resumable_together(resumed: Sequence[tuple[Args, Curriculum, dict]]) -> None:
    """Runs resumed in one process continue in step: the same configuration but for the seed, the same step, the
    same number of Adam steps and C-CHAIN updates (bad input, one line, before anything is written)."""
    (args0, curriculum0, state0), paths = resumed[0], [ckpt_lib.run_dir_of(st["path"]) for _, _, st in resumed]
    if len({a.seed for a, _, _ in resumed}) != len(resumed):
        raise UserError(f"resume: give runs of distinct seeds ({', '.join(paths)})")

    def adam_steps(state: dict) -> set:
        return {float(x["step"]) for x in state["optimizer"]["state"].values()}
    for (a, curriculum, state), path in zip(resumed[1:], paths[1:]):
        differ = [f.name for f in dataclasses.fields(Args)
                  if f.name not in PER_SEED and getattr(a, f.name) != getattr(args0, f.name)]
        if differ or curriculum != curriculum0:
            raise UserError(f"resume: {path} is not {paths[0]}'s run but for its seed (it differs in "
                            f"{', '.join(differ or ['the curriculum'])})")
        for what, get in (("step", lambda st: st["global_step"]), ("number of Adam steps", adam_steps),
                          ("number of C-CHAIN updates", lambda st: (st.get("c_chain") or {}).get("updates"))):
            if get(state) != get(state0):
                raise UserError(f"resume: the newest checkpoints of {paths[0]} and {path} differ in their {what} "
                                f"({get(state0)} and {get(state)}): resume each alone with agents/dqn.py --resume")


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None, seeds: Sequence[int] = (),
          run_names: Optional[Sequence[str]] = None, configs: Optional[Sequence[str]] = None,
          resumed: Sequence[tuple[Args, Curriculum, dict]] = ()) -> list[str]:
    """K seeds from the start (`seeds`), or K runs resumed together (`resumed`: each one's saved configuration,
    curriculum and newest checkpoint, at one step)."""
    if resume_state is not None:  # one run: dqn.py's
        raise UserError(RESUME)
    iteration_size = args.rollout_size()
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if resumed:
        check_resumable_together(resumed)
        each, states = [a for a, _, _ in resumed], [state for _, _, state in resumed]
    else:
        seeds = list(seeds) or [args.seed]
        check_supported(args, seeds, run_names)
        check_configs(args, seeds, configs)
        each = [seed_args(args, s, run_names[k] if run_names else None, configs[k] if configs else None)
                for k, s in enumerate(seeds)]
        states = [None] * len(each)
    check_batched_across_seeds(each[0])
    for a, state in zip(each, states):  # every seed's checks (its run directory free, ...) before any is created
        preflight(a, curriculum, state, iteration_size)
    runs: list[Seed] = []
    try:
        for a, state in zip(each, states):
            runs.append(build_seed(a, curriculum, device, iteration_size, state))
    except BaseException:
        for run in runs:  # the seeds already started: closed as their runs would be
            with contextlib.suppress(Exception):
                run.session.close()
        raise
    num_seeds, first = len(runs), runs[0]
    rngs = [r.session.np_rng for r in runs]  # each seed's exploration and replay draws, as dqn.py's
    n_actions = first.envs.single_action_space.n

    # the shared parameters: every seed's online, target and C-CHAIN reference networks, stacked
    params = stack([r.q_network for r in runs], split_unaligned=args.fused_adam)
    for t in leaves(params):
        t.requires_grad_()
    target_params = stack([r.target_network for r in runs])
    c_chain = first.c_chain is not None
    ref_params = stack([r.c_chain.ref for r in runs]) if c_chain else {}
    forward = seed_forward(first.q_network)
    # Adam is elementwise: over the stacked tensors it is K Adams (the same step count for every seed)
    optimizer = optim.Adam(leaves(params), lr=args.learning_rate,
                           **({"fused": True} if args.fused_adam else {"foreach": True}))
    if resumed:  # each seed's Adam state, as its checkpoint gave it to its own optimizer
        stacked_optimizer_state(optimizer, params, [(r.optimizer, r.q_network) for r in runs])
    replay = StackedReplay([r.rb for r in runs])
    updates = first.c_chain.updates if c_chain else 0
    minutes = first.session.checkpoint_minutes_off()
    for r in runs[1:]:
        r.session.checkpoint_minutes_off()

    def sync_seeds(grads: Optional[list]) -> None:
        """Each seed's own networks, optimizer and C-CHAIN state from the shared ones, before its session logs,
        evaluates and checkpoints (once per iteration)."""
        for k, r in enumerate(runs):
            copy_into(params, k, r.q_network)
            copy_into(target_params, k, r.target_network)
            seed_optimizer_state(optimizer, params, k, r.optimizer, r.q_network)
            if grads is not None:  # the diagnostics' gradient norms: the iteration's last update's
                for name, p in r.q_network.named_parameters():
                    p.grad = grads[k][name]
                r.monitor.record_grads()
            if c_chain:
                copy_into(ref_params, k, r.c_chain.ref)
                r.c_chain.updates = updates

    global_step = first.session.global_step
    epsilon_duration = args.exploration_fraction * first.session.total_timesteps
    random_phase = args.learning_starts if args.learning_starts_each_regime else 0
    with all_running(runs):
        for iterations in zip(*(r.session.iterations() for r in runs)):
            iteration = iterations[0]
            for r in runs:
                switched_obs = r.session.maybe_switch(r.envs)
                if switched_obs is not None:
                    r.obs = switched_obs
                    r.rb.begin(range(args.num_envs))
                    r.reward_scaler.episodes_cut()
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / first.session.num_iterations) * \
                    args.learning_rate

            t_iteration = time.time()
            env_time = [0.0] * num_seeds
            learn_time = 0.0
            losses: list[list[torch.Tensor]] = [[] for _ in runs]  # each seed's, as dqn.py's
            q_means: list[list[torch.Tensor]] = [[] for _ in runs]
            seen: list[list[torch.Tensor]] = [[] for _ in runs]
            for step in range(args.num_steps):
                epsilon = linear_schedule(args.start_e, args.end_e, epsilon_duration,
                                          max(global_step - first.at_switch.explore_from - random_phase, 0))
                in_random_phase = global_step - first.at_switch.regime_start < random_phase
                global_step += args.num_envs
                for r in runs:
                    r.session.global_step = global_step

                # ALGO LOGIC: epsilon-greedy, one coin per env, from each seed's generator (dqn.py's draws)
                actions = []
                for k, (r, rng) in enumerate(zip(runs, rngs)):
                    explore = rng.random(args.num_envs) < epsilon
                    actions.append(rng.integers(0, n_actions, size=args.num_envs))
                    if not (explore.all() or in_random_phase):
                        with torch.inference_mode():
                            greedy = forward(seed_params(params, k), torch.as_tensor(r.obs, device=device)).argmax(1)
                        actions[k] = np.where(explore, actions[k], greedy.cpu().numpy())

                for k, r in enumerate(runs):
                    seen[k].append(torch.as_tensor(r.obs))
                    t_env = time.time()
                    next_obs, reward, terminations, truncations, infos = r.envs.step(actions[k])
                    env_time[k] += time.time() - t_env
                    done = np.logical_or(terminations, truncations)
                    scaled = r.reward_scaler(reward, done)
                    real_next_obs = next_obs.copy()
                    for i in np.flatnonzero(done):
                        real_next_obs[i] = infos["final_obs"][i]
                    r.rb.add(r.obs, real_next_obs, actions[k], scaled, terminations)
                    r.rb.begin(np.flatnonzero(done))
                    r.obs = next_obs
                    for _, ep_return, ep_length in episode_stats(infos):
                        r.session.episode(ep_return, ep_length, global_step)

                # ALGO LOGIC: training, every seed at once
                if first.rb.added > args.learning_starts and global_step - first.at_switch.regime_start > random_phase:
                    t_learn = time.time()
                    previous = global_step - args.num_envs
                    for _ in range(global_step // args.train_frequency - previous // args.train_frequency):
                        batch = [torch.as_tensor(x, device=device) for x in
                                 replay.gather(*replay.sample_indices(args.replay_batch_size, rngs))]
                        has_reference = c_chain and updates >= first.c_chain.schedule.first_update
                        ref_obs = torch.as_tensor(replay.gather_obs(*replay.sample_indices(
                            args.replay_batch_size, rngs)), device=device) if has_reference else None
                        coefs = [r.c_chain.coef for r in runs] if has_reference else None
                        td, churn, q_mean = update(forward, params, target_params, ref_params, optimizer, batch,
                                                   ref_obs, coefs, args.gamma, args.double_dqn, global_step)
                        if c_chain:
                            updates += 1
                        for k in range(num_seeds):
                            losses[k].append(td[k])
                            q_means[k].append(q_mean[k])
                        if c_chain:  # each seed's record, its coefficient recomputed (CChain.after_step)
                            churns = churn.tolist() if churn is not None else [None] * num_seeds
                            for r, main_loss, churn_k in zip(runs, td.tolist(), churns):
                                r.c_chain.record(main_loss, churn_k)
                    if global_step // args.target_network_frequency != previous // args.target_network_frequency:
                        assign(target_params, lambda name, k: args.tau * params[name][k] +
                               (1.0 - args.tau) * target_params[name][k])
                    learn_time += time.time() - t_learn

            grads = [{name: (v[k].grad if isinstance(v, list) else v.grad[k]).clone() for name, v in params.items()}
                     for k in range(num_seeds)] if leaves(params)[0].grad is not None else None
            sync_seeds(grads)
            iteration_time = time.time() - t_iteration
            # one --checkpoint_minutes clock for the group, read once: its seeds save at the same step and resume
            # together (since the last checkpoint of any kind, as each session's own clock)
            if CheckpointCallback.due_by_time(min(r.session.last_save_time for r in runs), minutes):
                for r in runs:
                    CheckpointCallback.request(r.session)
            for k, r in enumerate(runs):
                r.ext.observe({"obs": torch.stack(seen[k]).to(device)})  # the monitor's probe (its generator's draw)
                check_parameters(r.q_network, global_step)
                r.session.end_iteration(iteration, {
                    "charts/learning_rate": optimizer.param_groups[0]["lr"], "charts/epsilon": epsilon,
                    "losses/td_loss": float(torch.stack(losses[k]).mean()) if losses[k] else math.nan,
                    "losses/q_values": float(torch.stack(q_means[k]).mean()) if q_means[k] else math.nan,
                    "charts/updates": len(losses[k]), "charts/replay_size": len(r.rb),
                    "time/env_s": env_time[k], "time/learn_s": learn_time / num_seeds,
                    "time/act_s": (iteration_time - sum(env_time) - learn_time) / num_seeds,
                })
    return [r.session.run_dir for r in runs]


def update(forward, params: dict, target_params: dict, ref_params: dict, optimizer: optim.Optimizer, batch: Sequence,
           ref_obs: Optional[torch.Tensor], coefs: Optional[Sequence[float]], gamma: float, double_dqn: bool,
           step: int) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """One update of every seed. dqn.py's loss seed by seed (the Double DQN or DQN target, the MSE, and with `ref_obs`
    C-CHAIN's coefs[k] x churn on seed k's reference batch against its `ref_params`), the losses summed over seeds for
    one backward pass (a seed's loss depends on its own parameters only: each gets its own gradient), C-CHAIN's
    reference set to the weights before the step (when `ref_params` has any), one Adam step. batch: (obs, actions,
    rewards, terminated, next_obs), (K, B, ...) each. Returns (K,) tensors: the TD losses, the churn terms (None
    without `ref_obs`) and the mean Q-values of the taken actions."""
    num_seeds = len(batch[1])
    views = seed_slices(params, num_seeds)
    td, churn, totals, q_mean = [], [], [], []
    for k in range(num_seeds):
        b_obs, b_actions, b_rewards, b_terminated, b_next = (x[k] for x in batch)
        with torch.no_grad():
            target = td_target(b_rewards, b_terminated, gamma, forward(seed_params(target_params, k), b_next),
                               forward(views[k], b_next) if double_dqn else None)
        old_val = forward(views[k], b_obs).gather(1, b_actions.long().unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(target, old_val)
        total = loss
        if ref_obs is not None:  # CChain.loss_terms
            with torch.no_grad():
                q_ref = forward(seed_params(ref_params, k), ref_obs[k])
            churn.append(q_churn(forward(views[k], ref_obs[k]), q_ref))
            total = loss + coefs[k] * churn[-1]
        td.append(loss)
        totals.append(total)
        q_mean.append(old_val.detach().mean())
    td_stack = torch.stack(td).detach()
    if not math.isfinite(float(td_stack.sum())):  # one float for every seed's loss; the message names the step
        for loss in td:
            check_losses(step, td_loss=loss)
    optimizer.zero_grad()
    sum(totals).backward()
    if ref_params:  # C-CHAIN's next reference: the weights before this step (CChain.before_step)
        assign(ref_params, lambda name, k: params[name][k])
    optimizer.step()
    return td_stack, torch.stack(churn).detach() if churn else None, torch.stack(q_mean)


def split_seeds(argv: Sequence[str]) -> tuple[list[int], Optional[list[str]], Optional[list[str]],
                                               Optional[list[str]], list[str]]:
    """--seeds S [S ...], --run_names N [N ...], --configs C [C ...] and --resume RUN [RUN ...] out of the command
    line; the rest is dqn.py's flags."""
    seeds: list[int] = []
    names: Optional[list[str]] = None
    configs: Optional[list[str]] = None
    resumes: Optional[list[str]] = None
    rest: list[str] = []
    target = None
    for a in argv:
        if a == "--resume" or a.startswith("--resume="):
            resumes = [] if resumes is None else resumes
            resumes += [a.split("=", 1)[1]] if "=" in a else []
            target = resumes
            continue
        if a in ("--seeds", "--run_names", "--run-names", "--configs"):
            target = seeds if a == "--seeds" else []
            if a == "--configs":
                configs = target
            elif a != "--seeds":
                names = target
            continue
        if target is not None and not a.startswith("--"):
            if target is seeds:
                try:
                    seeds.append(int(a))
                except ValueError:
                    raise UserError(f"seeds: {a!r} is not an integer") from None
            else:
                target.append(a)
            continue
        target = None
        rest.append(a)
    return seeds, names, configs, resumes, rest


def resume_group(resumes: Sequence[str], rest: Sequence[str]) -> list[str]:
    """--resume RUN [RUN ...]: each run's saved configuration and newest checkpoint (dqn.py --resume's reading, the
    same flags allowed beside it), then the group continues in one process."""
    resumed = []
    for run in resumes:
        args, curriculum, state = parse_train_args([*rest, "--resume", run], description=__doc__.splitlines()[0],
                                                   architecture="DQN")
        resumed.append((args, curriculum, state))
    check_resumable_together(resumed)
    for args, curriculum, state in resumed:
        print_config(args, curriculum, state)  # validates everything first
    args, curriculum, _ = resumed[0]
    return train(args, curriculum, resumed=resumed)


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> list[str]:
    seeds, run_names, configs, resumes, rest = split_seeds(list(sys.argv[1:] if argv is None else argv))
    flags = {a.split("=")[0].replace("-", "_") for a in rest}
    if resumes is not None:
        if not resumes or seeds or run_names is not None or configs is not None or "__config" in flags:
            raise UserError(RESUME)
        return resume_group(resumes, rest)
    named = "__run_name" in flags

    def train_seeds(args: Args, curriculum: Curriculum, resume_state: Optional[dict]) -> list[str]:
        # --run_name R: the seeds' runs are R__s<seed> (--run_names: one each); else dqn.py's default names
        names = run_names or ([f"{args.run_name}__s{s}" for s in seeds or [args.seed]] if named else None)
        return train(args, curriculum, resume_state, seeds, names, configs)
    return agent_main(train_seeds, "DQN", __doc__, rest)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
