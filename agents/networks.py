"""The shared networks of the actor-critic agents and their helpers (PPO, PPO_CBP, A2C, IMPALA, CLEAR, PNC; DQN
uses `obs_scale` and `action_dims`): `Agent` (Nature CNN for Atari frames, MinAtar's CNN for grids, an MLP for
vectors, or PureJaxRL's separate actor and critic MLPs), the fast `categorical`, `policy_head` for EWC, and
`make_agent(obs_space, action_space, args)`, the one contract every agent module's `make_agent` follows:
`obs_space` the env's single observation space (a Dict with --her), `action_space` its single action space (or, for
Discrete actions, the number of actions)."""

from __future__ import annotations

from typing import Optional, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.normal import Normal

from continual.config.args import Args
from continual.envs.goals import split_goal_space
from continual.errors import UserError
from continual.plasticity.networks import apply_network_options


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One action per row of `probs`: `torch.multinomial(probs, 1).squeeze(-1)` bit for bit (tested; with or without
    replacement, one draw is its argmax of p / q, q ~ Exp(1), from the same generator), without its checks of the
    probabilities: a dozen small operations that cost more than the draw (half of acting's sampling time for 64
    envs)."""
    return probs.div(torch.empty_like(probs).exponential_()).argmax(-1)


def categorical(logits: torch.Tensor, action: Optional[torch.Tensor] = None, greedy: bool = False,
                with_entropy: bool = True):
    """(action, log-prob, entropy) of a categorical policy: torch's `Categorical(logits=logits)` sample, log_prob and
    entropy written out in the same operations (the same numbers, gradients and random draws bit for bit; tested),
    without its per-call argument validation, which costs more than the math for small batches. `with_entropy=False`
    (acting, which drops it): entropy is None."""
    # the operations in Categorical's order (gradients accumulate in creation order: same order, same bits)
    log_p = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = None
    if action is None:
        if greedy:
            action = logits.argmax(-1)
        else:
            probs = torch.softmax(log_p, dim=-1)
            if torch.compiler.is_compiling():  # --compile: inductor would draw exponential_ from its own generator
                action = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
            else:
                action = draw(probs)
    index, log_pmf = torch.broadcast_tensors(action.long().unsqueeze(-1), log_p)
    logprob = log_pmf.gather(-1, index[..., :1]).squeeze(-1)
    if not with_entropy:
        return action, logprob, None
    probs = torch.softmax(log_p, dim=-1) if probs is None else probs
    entropy = -(log_p.clamp(min=torch.finfo(log_p.dtype).min) * probs).sum(-1)
    return action, logprob, entropy


def channels_last(obs_shape: Sequence[int], network: str = "default") -> bool:
    """Whether the network keeps its convolutions (and their input) channels-last: for pixel images (the Nature CNN
    on 84x84) that is ~25% faster on CPU (oneDNN); for small grids (MinAtar's 10x10) the NCHW layout is faster (the
    MinAtar CNN's update 1.1-1.15x, docs/benchmarks/small-envs.md), so they stay contiguous."""
    return len(obs_shape) == 3 and network != "mlp" and obs_shape[1] >= 36


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
        if channels_last(self.obs_shape, network):
            # channels-last convolution weights: ~25% faster updates on CPU (oneDNN), same results to float rounding
            self.to(memory_format=torch.channels_last)

    def scaled_input(self, x: torch.Tensor) -> torch.Tensor:
        """Observations as the network's float input (a new tensor, or `x` itself when it is float32 at scale 1: no
        layer writes its input). Pixels go to float32 in one pass, straight into the convolutions' channels-last
        layout: the same values bit for bit as `x.float() * obs_scale`, and faster Nature-CNN updates on CPU (1.13x
        in whole runs: the convolutions no longer reorder their input)."""
        if not channels_last(self.obs_shape, "mlp" if self.separate_critic else "default"):
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
                             goal: Optional[torch.Tensor] = None, with_entropy: bool = True):
        """(action, log-prob, entropy, value); `with_entropy=False` (acting): entropy is None, not computed."""
        hidden, critic_hidden = self.torsos(x, goal)
        if self.continuous:
            action_mean = self.actor(hidden).float()
            probs = Normal(action_mean, self.actor_logstd.expand_as(action_mean).exp())
            if action is None:
                action = action_mean if greedy else probs.sample()
            # independent dimensions: the joint log-density and entropy are sums
            return (action, probs.log_prob(action).sum(1), probs.entropy().sum(1) if with_entropy else None,
                    self.critic(critic_hidden).float())
        logits = self.actor(hidden).float()  # --bf16: the distribution and the losses stay float32
        action, logprob, entropy = categorical(logits, action, greedy, with_entropy)
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

    def make_optimizer(self, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                       fused: bool = False) -> optim.Optimizer:
        # foreach: one call per operation over all parameters (the default on GPUs, not on CPUs); the same numbers.
        # fused (--fused_adam): one kernel per parameter, the same update up to float rounding
        return optim.Adam(self.parameters(), lr=lr, betas=betas, eps=1e-5,
                          **({"fused": True} if fused else {"foreach": True}))


def policy_head(agent: Agent, x: torch.Tensor):
    """The policy's parameters at x, for EWC's Fisher (continual.plasticity.ewc): logits, or (mean, log-std)."""
    hidden = agent.features(x)
    if agent.continuous:
        mean = agent.actor(hidden)
        return mean, agent.actor_logstd.expand_as(mean)
    return agent.actor(hidden)


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
