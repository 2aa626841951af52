"""Continual PPO: CleanRL `ppo_atari` trained through a curriculum of environment modifications.

Run it directly (`python agents/ppo.py --config run_config.json`) or through
`python continual_training_example.py --architecture PPO`. The algorithm reads top to bottom in `train()`:
rollout -> GAE -> clipped-surrogate update, with the curriculum asked once per rollout. Around it, `continual`
provides the run directory, logging, checkpoints and switch hooks.

Continual specifics:
- at a switch the envs change in place and reset; the episode cut by the switch is bootstrapped from the value of
  the last observation (the rollout ends there), never treated as a termination;
- time-limit truncations inside a rollout are bootstrapped from the value of the final observation;
- the learning rate anneals over the whole run and Adam's state carries across switches.

Box action spaces (Pendulum, ...) follow CleanRL `ppo_continuous_action`: a Normal policy whose mean is the actor
head and whose log-std is a state-independent parameter; log-probs and entropies are summed over action dimensions;
the envs clip the sampled actions to the space's bounds (gymnasium ClipAction, `continual.envs.vector`) while the rollout
keeps the unclipped sample. `--norm_obs` and `--reward_scaling normalize` are that script's normalisations
(`configs/pendulum_gravity.json`: a Pendulum curriculum).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, Sequence

if __package__ in (None, ""):  # `python agents/ppo.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.normal import Normal

from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.console import Progress
from continual.envs.goals import split_goal_space
from continual.envs.vector import EnvSettings, episode_stats, make_vector_env, regime_slug
from continual.errors import TrainingError, UserError, exit_on_user_error
from continual.evaluation.continual import attach as attach_evaluator
from continual.her import HerRollout, weighted_mean
from continual.plasticity.diagnostics import PlasticityMonitor
from continual.plasticity.ewc import install_ewc
from continual.plasticity.injection import restore_injection
from continual.plasticity.methods import install_plasticity, plastic_optimizer
from continual.plasticity.networks import apply_network_options
from continual.plasticity.shrink_perturb import install_switch_remedies
from continual.training.guards import check_losses, check_parameters
from continual.training.rewards import RewardScaler
from continual.training.startup import parse_train_args, print_config, set_torch_threads, start_run


def categorical(logits: torch.Tensor, action: Optional[torch.Tensor] = None, greedy: bool = False):
    """(action, log-prob, entropy) of a categorical policy: torch's `Categorical(logits=logits)` sample, log_prob and
    entropy written out in the same operations (the same numbers, gradients and random draws bit for bit; tested),
    without its per-call argument validation, which costs more than the math for small batches."""
    # the operations in Categorical's order (gradients accumulate in creation order: same order, same bits)
    log_p = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = None
    if action is None:
        if greedy:
            action = logits.argmax(-1)
        else:
            probs = torch.softmax(log_p, dim=-1)
            action = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
    index, log_pmf = torch.broadcast_tensors(action.long().unsqueeze(-1), log_p)
    logprob = log_pmf.gather(-1, index[..., :1]).squeeze(-1)
    probs = torch.softmax(log_p, dim=-1) if probs is None else probs
    entropy = -(log_p.clamp(min=torch.finfo(log_p.dtype).min) * probs).sum(-1)
    return action, logprob, entropy


class ContiguousReLU(nn.ReLU):
    """ReLU whose output is contiguous: a channels-last convolution's features flatten (Flatten before the linear
    layer) without a strided copy in the forward and backward passes; the same values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).contiguous()


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature CNN for (C, 84, 84) pixel stacks, MinAtar's small CNN for (C, 10, 10) grids, an MLP for object or
    vector observations; shared torso.

    HER (goal_dim > 0): the MLP takes [observation, goal] as input; the CNN's 512 features h join the goal g in one
    fused layer before the heads, ReLU(W_h h + W_g g + b) (a linear layer on [h, g]).

    continuous (a Box action space of n_actions dimensions): `actor` gives the mean of a Normal policy (CleanRL's
    actor_mean) and `actor_logstd` its state-independent log standard deviation.
    norm_obs: observations are standardised by running statistics kept as buffers (saved with the weights) and
    clipped to [-10, 10], as gymnasium NormalizeObservation + clip in CleanRL's continuous script.
    """

    def __init__(self, obs_shape: Sequence[int], n_actions: int, obs_scale: float = 1.0, goal_dim: int = 0,
                 continuous: bool = False, norm_obs: bool = False, network: str = "default", hidden_size: int = 64,
                 mlp_activation: str = "relu"):
        super().__init__()
        self.obs_shape, self.n_actions = tuple(obs_shape), n_actions
        self.separate_critic = network == "mlp"
        self.obs_scale = obs_scale
        self.goal_dim = goal_dim
        self.continuous, self.norm_obs = continuous, norm_obs
        if norm_obs:  # float64: the counts grow to millions
            self.register_buffer("obs_mean", torch.zeros(self.obs_shape, dtype=torch.float64))
            self.register_buffer("obs_var", torch.ones(self.obs_shape, dtype=torch.float64))
            self.register_buffer("obs_count", torch.tensor(1e-4, dtype=torch.float64))
        if network == "mlp":
            # PureJaxRL's ActorCritic: separate actor and critic MLPs on the flattened observation
            def torso() -> nn.Sequential:
                act = nn.ReLU if mlp_activation == "relu" else nn.Tanh
                return nn.Sequential(nn.Flatten(), layer_init(nn.Linear(int(np.prod(obs_shape)), hidden_size)), act(),
                                     layer_init(nn.Linear(hidden_size, hidden_size)), act())

            self.network, self.critic_network = torso(), torso()
            hidden = hidden_size
        elif len(obs_shape) == 3 and obs_shape[1] < 36:
            # small grids (MinAtar's 10x10): the MinAtar paper's network, one 3x3 convolution and 128 units
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 16, 3, stride=1)), ContiguousReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(16 * (obs_shape[1] - 2) * (obs_shape[2] - 2), 128)), nn.ReLU(),
            )
            hidden = 128
        elif len(obs_shape) == 3:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), ContiguousReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
            )
            hidden = 512
        else:
            n_in = int(np.prod(obs_shape))
            hidden = 64 if n_in <= 32 else 256
            self.network = nn.Sequential(
                nn.Flatten(),
                layer_init(nn.Linear(n_in + goal_dim, hidden)), nn.Tanh(),  # HER: the goal is part of the input
                layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
            )
        self.actor = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, n_actions))
        self.critic = layer_init(nn.Linear(hidden, 1), std=1)
        if goal_dim and len(obs_shape) == 3:  # HER: the goal joins the CNN features before the heads
            self.goal_fusion = layer_init(nn.Linear(hidden, hidden))
            self.goal_embed = nn.Linear(goal_dim, hidden, bias=False)
            torch.nn.init.orthogonal_(self.goal_embed.weight, np.sqrt(2))
            self.goal_act = nn.ReLU()
        if len(obs_shape) == 3 and network != "mlp":
            # channels-last convolution weights: ~25% faster updates on CPU (oneDNN), same results to float rounding
            self.to(memory_format=torch.channels_last)

    def scaled_input(self, x: torch.Tensor) -> torch.Tensor:
        """Observations as the network's float input (a new tensor, or `x` itself when it is float32 at scale 1: no
        layer writes its input). Pixels go to float32 in one pass, straight into the convolutions' channels-last
        layout: the same values bit for bit as `x.float() * obs_scale`, and faster Nature-CNN updates on CPU (1.13x
        in whole runs: the convolutions no longer reorder their input)."""
        if len(self.obs_shape) != 3 or self.separate_critic:
            if self.obs_scale == 1.0 and x.dtype == torch.float32:
                return x
            return x.float() * self.obs_scale
        x = x.to(dtype=torch.float32, memory_format=torch.channels_last, copy=True)
        return x.mul_(self.obs_scale) if self.obs_scale != 1.0 else x

    def network_input(self, x: torch.Tensor) -> torch.Tensor:
        x = self.scaled_input(x)
        if self.norm_obs:
            x = ((x - self.obs_mean.float()) / torch.sqrt(self.obs_var.float() + 1e-8)).clamp(-10.0, 10.0)
        return x

    def features(self, x: torch.Tensor, goal: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The actor's hidden features (the shared torso's, or with --network mlp the actor MLP's)."""
        x = self.network_input(x)
        if not self.goal_dim:
            if goal is not None:
                raise ValueError("this agent is not goal-conditioned (trained without --her); pass no goal")
            return self.network(x)
        # HER: a missing goal (plasticity probes) stands for the zero goal
        goal = torch.zeros((x.shape[0], self.goal_dim), device=x.device) if goal is None else goal.float()
        if len(self.obs_shape) == 3:
            return self.goal_act(self.goal_fusion(self.network(x)) + self.goal_embed(goal))
        return self.network(torch.cat([x.flatten(1), goal], dim=1))

    def torsos(self, x: torch.Tensor, goal: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor features, critic features): the same tensor for a shared torso."""
        if not self.separate_critic:
            hidden = self.features(x, goal)
            return hidden, hidden
        x = self.network_input(x)
        return self.network(x), self.critic_network(x)

    def get_value(self, x: torch.Tensor, goal: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.separate_critic:
            return self.critic(self.critic_network(self.network_input(x)))
        return self.critic(self.features(x, goal))

    def get_action_and_value(self, x: torch.Tensor, action: Optional[torch.Tensor] = None, greedy: bool = False,
                             goal: Optional[torch.Tensor] = None):
        hidden, critic_hidden = self.torsos(x, goal)
        if self.continuous:
            action_mean = self.actor(hidden).float()
            probs = Normal(action_mean, self.actor_logstd.expand_as(action_mean).exp())
            if action is None:
                action = action_mean if greedy else probs.sample()
            # independent dimensions: the joint log-density and entropy are sums
            return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(critic_hidden).float()
        logits = self.actor(hidden).float()  # --bf16: the distribution and the losses stay float32
        action, logprob, entropy = categorical(logits, action, greedy)
        return action, logprob, entropy, self.critic(critic_hidden).float()

    @torch.no_grad()
    def update_obs_stats(self, obs: torch.Tensor) -> None:
        """--norm_obs: fold a batch of observations (leading dims flattened) into the running mean/variance."""
        x = obs.reshape((-1,) + self.obs_shape).double() * self.obs_scale
        b_mean, b_var, b_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = b_mean - self.obs_mean, self.obs_count + b_count
        m2 = self.obs_var * self.obs_count + b_var * b_count + delta**2 * self.obs_count * b_count / total
        self.obs_mean += delta * b_count / total
        self.obs_var.copy_(m2 / total)
        self.obs_count.copy_(total)

    def make_optimizer(self, lr: float) -> optim.Optimizer:
        # foreach: one fused update over all parameters (the default on GPUs, not on CPUs); the same numbers
        return optim.Adam(self.parameters(), lr=lr, eps=1e-5, foreach=True)

    # hooks around the update, for subclasses (PPO_CBP maintains its hidden units here)
    def before_update(self) -> None:
        pass

    def after_optimizer_step(self, optimizer: optim.Optimizer) -> None:
        pass

    def after_update(self) -> None:
        pass


def policy_head(agent: Agent, x: torch.Tensor):
    """The policy's parameters at x, for EWC's Fisher (continual.plasticity.ewc): logits, or (mean, log-std)."""
    hidden = agent.features(x)
    if agent.continuous:
        mean = agent.actor(hidden)
        return mean, agent.actor_logstd.expand_as(mean)
    return agent.actor(hidden)


def ewc_batch_loss(args: Args):
    """EWC's `--ewc_fisher cora` loss (CORA's checkpoint_task, pg + value loss without entropy, summed over the batch
    as CORA's): -sum A log pi(a|s) (the clipped surrogate's gradient at ratio 1) + vf_coef/2 sum (R - V)^2."""
    def loss(agent: "Agent", batch: dict) -> torch.Tensor:
        _, logprob, _, value = agent.get_action_and_value(batch["obs"], batch["action"])
        return (-(batch["advantage"] * logprob).sum()
                + args.vf_coef * 0.5 * ((value.view(-1) - batch["return"]) ** 2).sum())
    return loss


def obs_scale(obs_space, args: Args) -> float:
    """Pixels and object coordinates (0-255) are scaled to [0, 1]; vector observations are used as they are."""
    if args.obs_mode == "ori" and args.backend != "Gymnasium":
        raise UserError("obs_mode: 'ori' (raw RGB frames) is for evaluation videos; train with dqn or obj")
    return 1.0 / 255.0 if obs_space.dtype == np.uint8 or (args.obs_mode == "obj" and args.backend != "Gymnasium") else 1.0


def action_dims(action_space) -> tuple[int, bool]:
    """(n_actions, continuous): Discrete(n) (or a bare n) -> (n, False); a Box -> (its number of elements, True)
    (`continual.envs.vector` presents multi-dimensional Boxes flattened)."""
    if isinstance(action_space, (int, np.integer)):
        return int(action_space), False
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n), False
    if isinstance(action_space, gym.spaces.Box):
        return int(np.prod(action_space.shape)), True
    raise UserError(f"action space {action_space} is not supported (Discrete or Box)")


def make_agent(obs_space, action_space, args: Args) -> Agent:
    """`action_space`: the env's single action space (or, for Discrete, its number of actions)."""
    obs_space, goal_dim = split_goal_space(obs_space)  # HER: Dict observations carry the goal
    n_actions, continuous = action_dims(action_space)
    agent = Agent(obs_space.shape, n_actions, obs_scale=obs_scale(obs_space, args), goal_dim=goal_dim,
                  continuous=continuous, norm_obs=getattr(args, "norm_obs", False), network=args.network,
                  hidden_size=args.hidden_size, mlp_activation=args.mlp_activation)
    return apply_network_options(agent, args)  # --layer_norm, --activation


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None,
          make_agent_fn: Callable[..., Agent] = make_agent) -> str:
    """Train through the curriculum; `make_agent_fn` lets PPO variants (PPO_CBP) bring their own network."""
    batch_size = args.rollout_size()
    minibatch_size = args.minibatch_size()
    session = start_run(args, curriculum, resume_state, granularity=batch_size)
    num_iterations = session.total_timesteps // batch_size
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    settings = EnvSettings.from_args(args, video_dir=session.video_dir, regimes=session.regimes,
                                     start_step=session.global_step)
    envs = make_vector_env(settings, args.num_envs, session.modification, args.vector_env)
    try:
        agent = make_agent_fn(envs.single_observation_space, envs.single_action_space, args).to(device)
        set_torch_threads(args, agent.obs_shape)
        optimizer = plastic_optimizer(agent.make_optimizer(args.learning_rate), args)  # --trac wraps it
        reward_scaler = RewardScaler(args.reward_scaling, args.num_envs, args.gamma)
        monitor = session.add_callback(PlasticityMonitor(session, agent))  # logs before every switch too
        if resume_state is not None:
            restore_injection(agent, resume_state["model"], optimizer)  # --plasticity_injection: its heads first
            agent.load_state_dict(resume_state["model"])
            optimizer.load_state_dict(resume_state["optimizer"])
            reward_scaler.load_state_dict(resume_state["reward_scaler"])
            monitor.load_state_dict(resume_state["plasticity"])
        def make_fresh() -> Agent:
            return make_agent_fn(envs.single_observation_space, envs.single_action_space, args).to(device)

        install_switch_remedies(session, agent, optimizer, make_fresh)
        plasticity = install_plasticity(session, agent, optimizer, make_fresh, resume_state)  # ReDo, L2, resets, ...
        ewc = install_ewc(session, agent, policy_head, agent.continuous, resume_state,  # --ewc: None without
                          ewc_batch_loss(args))
        session.save_fn = lambda: {
            "model": agent.state_dict(), "optimizer": optimizer.state_dict(),
            "reward_scaler": reward_scaler.state_dict(), "obs_shape": list(agent.obs_shape),
            "n_actions": agent.n_actions, "obs_scale": agent.obs_scale, "plasticity": monitor.state_dict(),
            "goal_dim": agent.goal_dim, "continuous": agent.continuous,
            "ewc": ewc.state_dict() if ewc else None, "plasticity_methods": plasticity.state_dict(),
        }
        attach_evaluator(session, agent, device, make_agent_fn)  # continual evaluation (--eval_every): step 0 now, then a session callback
        # --compile: the update's forward pass (and so its backward) as compiled graphs; the rollout stays eager
        update_forward = torch.compile(agent.get_action_and_value) if args.compile else agent.get_action_and_value

        # ALGO Logic: storage setup (pixel observations stay uint8: a 4x smaller buffer to gather minibatches from)
        # HER: observations are Dicts; `her` keeps goals, achieved goals and what relabelling needs (None without HER)
        her = HerRollout(args, envs.single_observation_space, device, session.np_rng) if args.her else None
        obs_space, _ = split_goal_space(envs.single_observation_space)
        obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        obs = torch.zeros((args.num_steps, args.num_envs) + obs_space.shape, dtype=obs_dtype).to(device)
        # Box actions: float vectors of n_actions dims (the unclipped samples: their log-probs are the policy's)
        action_shape = (agent.n_actions,) if agent.continuous else ()
        actions = torch.zeros((args.num_steps, args.num_envs) + action_shape,
                              dtype=torch.float32 if agent.continuous else torch.long).to(device)
        logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
        rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
        dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
        values = torch.zeros((args.num_steps, args.num_envs)).to(device)

        session.restore_torch_rng()  # resumed: as the checkpoint had it (building the networks drew from it)
        # TRY NOT TO MODIFY: start the game
        global_step = session.global_step
        start_iteration = global_step // batch_size + 1
        next_obs_np, _ = envs.reset(seed=args.seed + global_step)
        if her:  # HER: the goal part of the observation goes to `her.next_goal`
            next_obs_np = her.take_goals(next_obs_np)
        next_obs = torch.as_tensor(next_obs_np, device=device)
        next_done = torch.zeros(args.num_envs).to(device)
        progress = Progress(session, enabled=args.progress_bar)

        for iteration in range(start_iteration, num_iterations + 1):
            switched_obs = session.maybe_switch(envs)
            if switched_obs is not None:
                if her:  # HER: new episodes, new goals
                    switched_obs = her.take_goals(switched_obs)
                next_obs = torch.as_tensor(switched_obs, device=device)
                next_done = torch.zeros(args.num_envs).to(device)
                reward_scaler.episodes_cut()

            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            t_rollout = time.time()
            env_time = forward_time = 0.0
            for step in range(0, args.num_steps):
                global_step += args.num_envs
                session.global_step = global_step
                obs[step] = next_obs
                dones[step] = next_done
                if her:  # HER
                    her.goals[step] = her.next_goal

                # ALGO LOGIC: action logic
                t_forward = time.time()
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(
                        next_obs, goal=her.next_goal if her else None)  # HER: the episode's goal
                    values[step] = value.flatten()
                forward_time += time.time() - t_forward
                actions[step] = action
                logprobs[step] = logprob

                # TRY NOT TO MODIFY: execute the game and log data.
                t_env = time.time()
                next_obs_np, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                env_time += time.time() - t_env
                done = np.logical_or(terminations, truncations)
                # HER: the goal part of the observation goes to `her.next_goal`
                next_obs = torch.as_tensor(her.take_goals(next_obs_np) if her else next_obs_np, device=device)
                next_done = torch.as_tensor(done, dtype=torch.float32, device=device)
                scaled = reward_scaler(reward, done)
                if her:  # HER: + the goal reward of this step's achieved goal; keeps what relabelling needs
                    scaled = her.step_rewards(step, scaled, next_obs_np, terminations, truncations, infos)
                cut = np.flatnonzero(truncations & ~terminations)
                if len(cut):  # time limit: bootstrap from the value of the observation the episode ended on
                    if her:  # HER: Dict final observations, valued for their own goal
                        final, final_goal = her.final_observations(step, cut, infos)
                    else:
                        final, final_goal = torch.as_tensor(np.stack([infos["final_obs"][i] for i in cut]),
                                                             device=device), None
                    with torch.no_grad():
                        scaled[cut] += args.gamma * agent.get_value(final, goal=final_goal).flatten().cpu().numpy()
                rewards[step] = torch.as_tensor(scaled, device=device)
                for i, ep_return, ep_length in episode_stats(infos):
                    session.episode(ep_return, ep_length, global_step, env=i)
            rollout_time = time.time() - t_rollout
            monitor.observe(obs)

            # bootstrap value if not done
            t_learn = time.time()
            with torch.no_grad():
                next_value = agent.get_value(next_obs, goal=her.next_goal if her else None).reshape(1, -1)
                advantages = torch.zeros_like(rewards).to(device)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal = 1.0 - next_done
                        nextvalues = next_value
                    else:
                        nextnonterminal = 1.0 - dones[t + 1]
                        nextvalues = values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                returns = advantages + values

            # flatten the batch
            b_obs = obs.reshape((-1,) + obs_space.shape)
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape((-1,) + action_shape)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)
            if ewc:  # EWC: its Fisher is estimated on the last samples of a regime
                ewc.observe(b_obs, obs_space.shape, {"obs": b_obs, "action": b_actions, "advantage": b_advantages,
                                                     "return": b_returns})

            # HER: relabelled samples join the batch. b_src[k]: the rollout sample whose observation (and action)
            # sample k uses; b_goals[k]: its goal; b_weights[k]: its importance weight (1 for original samples)
            n_samples, mb_size, b_weights = batch_size, minibatch_size, None
            if her:
                b_src = torch.arange(batch_size, device=device)
                b_goals = her.goals.reshape(batch_size, -1)
                b_weights = torch.ones(batch_size, device=device)
                if args.her_ratio > 0:
                    rl = her.relabel(agent, obs, actions, logprobs, dones, next_obs)
                    b_src, b_goals = torch.cat([b_src, rl.src]), torch.cat([b_goals, rl.goals])
                    b_weights, b_logprobs = torch.cat([b_weights, rl.weights]), torch.cat([b_logprobs, rl.logprobs])
                    b_actions = b_actions[b_src]
                    b_advantages = torch.cat([b_advantages, rl.advantages])
                    b_returns, b_values = torch.cat([b_returns, rl.returns]), torch.cat([b_values, rl.values])
                n_samples = len(b_src)
                mb_size = -(-n_samples // args.num_minibatches)

            # Optimizing the policy and value network
            b_inds = np.arange(n_samples)
            clipfracs = []
            agent.before_update()
            for epoch in range(args.update_epochs):
                session.np_rng.shuffle(b_inds)
                for start in range(0, n_samples, mb_size):
                    mb_inds = torch.as_tensor(b_inds[start:start + mb_size], device=device)
                    if her:  # HER: a relabelled sample is its rollout observation with another goal
                        mb_obs, mb_goals, mb_weights = b_obs[b_src[mb_inds]], b_goals[mb_inds], b_weights[mb_inds]
                        her.count_trained(mb_inds, batch_size)
                    else:
                        mb_obs, mb_goals, mb_weights = b_obs[mb_inds], None, None

                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                        _, newlogprob, entropy, newvalue = update_forward(mb_obs, b_actions[mb_inds], goal=mb_goals)
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()

                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                    # Policy loss
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = weighted_mean(torch.max(pg_loss1, pg_loss2), mb_weights)  # HER: IS-weighted

                    # Value loss
                    newvalue = newvalue.view(-1)
                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_clipped = b_values[mb_inds] + torch.clamp(
                            newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                        v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                        v_loss = 0.5 * weighted_mean(torch.max(v_loss_unclipped, v_loss_clipped), mb_weights)
                    else:
                        v_loss = 0.5 * weighted_mean((newvalue - b_returns[mb_inds]) ** 2, mb_weights)

                    entropy_loss = entropy.mean()
                    ewc_loss = ewc.penalty() if ewc else 0.0  # EWC: lambda/2 * sum F (theta - theta*)^2
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + ewc_loss
                    loss = loss + plasticity.penalty()  # --l2, --l2_init, --parseval (0.0 without)
                    check_losses(global_step, value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss)

                    optimizer.zero_grad()
                    loss.backward()
                    monitor.record_grads()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.grad_clip_norm())
                    optimizer.step()
                    plasticity.after_step()  # --nap: weights back to their initial norms
                    agent.after_optimizer_step(optimizer)

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            agent.after_update()
            plasticity.after_update(obs)  # --redo, --reset_layers, when due
            if agent.norm_obs:  # after the update: the stored log-probs and values were those of the old statistics
                agent.update_obs_stats(obs)
            check_parameters(agent, global_step)

            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
            learn_time = time.time() - t_learn

            session.end_iteration(iteration, {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "losses/value_loss": v_loss.item(), "losses/policy_loss": pg_loss.item(),
                "losses/entropy": entropy_loss.item(), "losses/old_approx_kl": old_approx_kl.item(),
                "losses/approx_kl": approx_kl.item(), "losses/clipfrac": float(np.mean(clipfracs)),
                "losses/explained_variance": float(explained_var),
                **({"losses/ewc_penalty": ewc_loss.item()} if ewc else {}), **plasticity.take_log(),
                "time/env_s": env_time, "time/act_s": rollout_time - env_time, "time/forward_s": forward_time,
                "time/learn_s": learn_time,
                **(her.scalars(regime_slug(session.modification)) if her else {}),  # HER: success, relabelling
            })
            monitor.maybe_log()
            progress.update()
            if session.stop_signal is not None:
                break

        progress.close()
        session.finish()
        return session.run_dir
    except TrainingError as e:
        # a fault with good weights (a dead env worker, a NaN loss caught before the step) keeps the last iteration
        raise session.failure(e) from None
    finally:
        envs.close()
        session.close()
        if session.stop_signal is not None:
            raise SystemExit(128 + session.stop_signal)


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> str:
    args, curriculum, resume_state = parse_train_args(argv, description=__doc__.splitlines()[0], architecture="PPO")
    print_config(args, curriculum, resume_state)  # validates everything first
    return train(args, curriculum, resume_state)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
