"""Continual DQN: CleanRL `dqn_atari` trained through a curriculum of environment modifications.

Run it directly (`python agents/dqn.py --config configs/dqn_atari.json`) or through
`python continual_training_example.py --architecture DQN`. The algorithm reads top to bottom in `train()`:
epsilon-greedy steps into a replay buffer -> TD updates every `--train_frequency` agent steps -> a (soft) copy into
the target network every `--target_network_frequency` agent steps. The curriculum is asked once per iteration of
`--num_steps` vector steps, which is also when statistics are logged.

CleanRL semantics (`dqn_atari.py`): Adam, MSE on the TD error, target r + gamma * (1 - terminated) * max_a Q_target(s', a)
(`--double_dqn`: Q_target(s', argmax_a Q(s', a)), van Hasselt et al. 2016), epsilon linear from `--start_e` to `--end_e`
over `--exploration_fraction` of the run, training once more than `--learning_starts` transitions are stored. Counts
are agent steps summed over envs (CleanRL counts vector steps; the same with its `num_envs=1`), so the replay ratio does
not change with `--num_envs`; each env flips its own exploration coin.

The replay buffer keeps one uint8 frame per transition (`ReplayBuffer`): an observation is the last k frames of its
env's ring, never a frame of another episode (each episode start writes its whole first stack). A 1M-transition Atari
buffer is 84*84 + 10 = 7,066 bytes per transition, 7.1 GB (CleanRL's SB3 buffer with optimize_memory_usage stores the
4-frame stack: 28.2 GB).

Continual specifics:
- at a switch the envs change in place and reset; the transition cut by the switch keeps its real next observation and
  is bootstrapped (not terminated); the replay buffer keeps transitions of earlier regimes unless
  `--reset_replay_on_switch` (then training pauses until `--learning_starts` new transitions are stored);
  `--epsilon_rewarm_on_switch` restarts the epsilon decay at every switch (both off by default);
  `--learning_starts_each_regime` makes the first `--learning_starts` steps of every regime uniformly random and
  update-free (C-CHAIN's Continual MinAtar), epsilon decaying from the end of the first such phase;
- `--c_chain` (continual/plasticity/c_chain.py) adds C-CHAIN's churn term on a second replay batch to every update;
- time-limit truncations are bootstrapped from the final observation (infos["final_obs"]);
- shrink & perturb acts on the online network; the target network follows at its next update;
- every random choice (exploration, replay sampling) comes from the session's checkpointed numpy generator, so a run
  resumed from a checkpoint with `--save_replay_buffer` continues exactly as the uninterrupted run would (the envs
  themselves restart their episodes at a resume). Without the buffer a resumed run refills `--learning_starts`
  transitions before training again.

Continual evaluation and eval.py: `actor(features)` returns the log-probabilities of the epsilon-greedy policy with
epsilon EVAL_EPSILON = 0.05 (CleanRL's `evaluate`): the greedy flag takes the argmax Q action, sampling plays
0.05-greedy.

Spec (continual/specs.py):
- its own defaults: --learning_rate 0.0001 --no-anneal_lr --num_envs 1
- supports: c_chain, dqn_flags, fused_adam, network_options, plasticity, seeds_in_one_process, shrink_and_perturb
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Optional, Sequence

if __package__ in (None, ""):  # `python agents/dqn.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions.categorical import Categorical

from agents.networks import action_dims, obs_scale
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.envs.vector import EnvSettings, episode_stats, make_vector_env
from continual.errors import TrainingError, UserError
from continual.methods import AgentForm, add_continual
from continual.plasticity.c_chain import DQN_SCHEDULE, ChurnForm, q_churn
from continual.plasticity.networks import apply_network_options
from continual.training.extensions import Extension
from continual.training.guards import check_losses, check_parameters
from continual.training.rewards import RewardScaler
from continual.training.startup import agent_main, set_torch_threads, start_run

# the default of CleanRL's evaluate(): sampled (non-greedy) evaluation plays 0.05-greedy (CleanRL's scripts pass their
# end_e: 0.01 in dqn_atari.py, 0.05 in dqn.py)
EVAL_EPSILON = 0.05


class QNetwork(nn.Module):
    """CleanRL's Q-networks: the Nature CNN for (C, 84, 84) pixel stacks, a 120-84 ReLU MLP for vector observations
    (dqn.py), MinAtar's network for (C, 10, 10) grids; PyTorch's default initialisation. `network` is the torso (plasticity diagnostics read it)."""

    def __init__(self, obs_shape: Sequence[int], n_actions: int, obs_scale: float = 1.0):
        super().__init__()
        self.obs_shape, self.n_actions, self.obs_scale = tuple(obs_shape), n_actions, obs_scale
        self.goal_dim, self.continuous = 0, False
        if len(obs_shape) == 3 and obs_shape[1] < 36:
            # small grids (MinAtar's 10x10; the Nature CNN's 8x8/4 convolution leaves 1x1 of them): the MinAtar
            # paper's DQN network (Young & Tian 2019), one 3x3 convolution of 16 channels and 128 units
            self.network = nn.Sequential(
                nn.Conv2d(obs_shape[0], 16, 3, stride=1), nn.ReLU(),
                nn.Flatten(),
                nn.Linear(16 * (obs_shape[1] - 2) * (obs_shape[2] - 2), 128), nn.ReLU(),
            )
            hidden = 128
        elif len(obs_shape) == 3:
            self.network = nn.Sequential(
                nn.Conv2d(obs_shape[0], 32, 8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
                nn.Flatten(),
                nn.Linear(3136, 512), nn.ReLU(),
            )
            hidden = 512
        else:
            self.network = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(obs_shape)), 120), nn.ReLU(),
                                         nn.Linear(120, 84), nn.ReLU())
            hidden = 84
        self.q_head = nn.Linear(hidden, n_actions)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        # x * 1.0 is x: the multiplication (an allocation and a pass, several times per update) only for pixels
        return self.network(x if self.obs_scale == 1.0 else x * self.obs_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Q(x, .) for a batch of observations."""
        return self.q_head(self.features(x))

    def actor(self, features: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the EVAL_EPSILON-greedy policy (their argmax is the greedy action)."""
        q = self.q_head(features)
        probs = torch.full_like(q, EVAL_EPSILON / self.n_actions)
        probs.scatter_add_(1, q.argmax(1, keepdim=True), torch.full_like(q[:, :1], 1.0 - EVAL_EPSILON))
        return probs.log()

    def get_action_and_value(self, x: torch.Tensor, action: Optional[torch.Tensor] = None, greedy: bool = False,
                             goal: Optional[torch.Tensor] = None):
        """eval.py's interface: (action, log-prob, entropy) under the eval policy, and max_a Q as the value."""
        if goal is not None:
            raise ValueError("DQN agents are not goal-conditioned")
        hidden = self.features(x)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = self.q_head(hidden).argmax(-1) if greedy else probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.q_head(hidden).max(-1, keepdim=True).values


def make_agent(obs_space, action_space, args: Args) -> QNetwork:
    """`action_space`: the env's single (Discrete) action space or its number of actions."""
    n_actions, continuous = action_dims(action_space)
    if continuous:
        raise UserError("architecture: DQN needs a discrete action space")
    q_network = QNetwork(obs_space.shape, n_actions, obs_scale=obs_scale(obs_space, args))
    return apply_network_options(q_network, args, orthogonal=False)  # --layer_norm, --activation, --nap


def td_target(rewards: torch.Tensor, terminated: torch.Tensor, gamma: float, next_q_target: torch.Tensor,
              next_q_online: Optional[torch.Tensor] = None) -> torch.Tensor:
    """r + gamma * (1 - terminated) * Q_target(s', a*): a* = argmax_a Q_target(s', a), or with `next_q_online` (Double
    DQN) a* = argmax_a Q_online(s', a). Shapes: (B,) and (B, n_actions)."""
    if next_q_online is None:
        next_value = next_q_target.max(1).values
    else:
        next_value = next_q_target.gather(1, next_q_online.argmax(1, keepdim=True)).squeeze(1)
    return rewards + gamma * next_value * (1.0 - terminated.float())


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """CleanRL's epsilon: linear from start_e at t=0 to end_e at t=duration, then end_e."""
    if duration <= 0:
        return end_e
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e) if end_e <= start_e else min(slope * t + start_e, end_e)


class ReplayBuffer:
    """Uniform replay with one frame per transition, in one ring of `capacity // num_envs` slots per env.

    Pixel stacks (uint8, (k, H, W)): a slot holds one frame; the observation ending at slot i is frames i-k+1..i of
    its env's ring. Other observations: a slot holds the whole observation (k = 1). An episode's first observation
    is written whole (k slots) before its first transition, and every later slot holds the newest frame of the next
    observation, so the window of a stored transition never reaches into another episode, a switch cut or a slot
    overwritten by the wrap-around (writing slot p invalidates the transitions of slots p+1..p+k, whose windows held
    it). Slot i, when valid, stores the transition (obs i-1 -> obs i): action, reward and termination.
    """

    def __init__(self, capacity: int, num_envs: int, obs_shape: Sequence[int], obs_dtype: np.dtype,
                 binary: bool = False):
        self.obs_shape, self.obs_dtype, self.binary = tuple(obs_shape), np.dtype(obs_dtype), binary
        self.k = obs_shape[0] if (len(obs_shape) == 3 and obs_dtype == np.uint8) else 1
        frame_shape = self.obs_shape[1:] if self.k > 1 else self.obs_shape
        self.num_envs, self.n = num_envs, capacity // num_envs
        if self.n < 2 * self.k + 2:
            raise UserError(f"buffer_size: {capacity} is too small for {num_envs} envs (at least "
                            f"{(2 * self.k + 2) * num_envs})")
        # np.zeros maps pages lazily: memory is used as the rings fill. `binary` (MinAtar's 0/1 float grids): frames
        # stored as bools, a quarter of the memory and of a checkpoint, read back as the same floats
        self.frames = np.zeros((num_envs, self.n) + frame_shape, dtype=np.bool_ if binary else obs_dtype)
        self.actions = np.zeros((num_envs, self.n), dtype=np.int32)
        self.rewards = np.zeros((num_envs, self.n), dtype=np.float32)
        self.terminated = np.zeros((num_envs, self.n), dtype=np.bool_)
        self.valid = np.zeros((num_envs, self.n), dtype=np.bool_)
        self.pos = np.zeros(num_envs, dtype=np.int64)  # slots written so far, per env (the next one is pos % n)
        self._ahead = np.arange(1, self.k + 1)  # the slots a write invalidates, relative to it
        self.fresh = np.ones(num_envs, dtype=np.bool_)  # the env's current observation is not in its ring yet
        self.added = 0  # transitions stored since the buffer was created or cleared

    def bytes_per_transition(self) -> int:
        slot = self.frames[0, 0]
        return slot.nbytes + self.actions.itemsize + self.rewards.itemsize + 2  # + terminated, valid

    def __len__(self) -> int:
        return int(self.valid.sum())

    def begin(self, envs: Sequence[int]) -> None:
        """These envs start an episode (reset, switch, resume): their next `add` writes the whole observation."""
        self.fresh[np.asarray(envs, dtype=np.int64)] = True

    def clear(self) -> None:
        self.valid[:] = False
        self.added = 0

    def _write(self, e: int, frame: np.ndarray, transition: bool) -> int:
        p = int(self.pos[e])
        self.valid[e, (p + self._ahead) % self.n] = False
        slot = p % self.n
        self.frames[e, slot] = frame
        if self.binary and not np.array_equal(self.frames[e, slot], frame):
            raise TrainingError("replay buffer: an observation that is not 0/1 in a buffer that stores bools")
        self.valid[e, slot] = transition
        self.pos[e] = p + 1
        return slot

    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminated: np.ndarray) -> None:
        """One vector step: obs[e] -a[e]-> next_obs[e] (the real next observation: the final one at an episode end)."""
        for e in range(self.num_envs):
            if self.fresh[e]:
                for j in range(self.k):
                    self._write(e, obs[e][j] if self.k > 1 else obs[e], False)
                self.fresh[e] = False
            elif self.k > 1 and not np.array_equal(next_obs[e][:-1], obs[e][1:]):
                raise TrainingError("replay buffer: consecutive pixel observations are not frame stacks shifted by "
                                    "one frame")
            slot = self._write(e, next_obs[e][-1] if self.k > 1 else next_obs[e], True)
            self.actions[e, slot], self.rewards[e, slot] = actions[e], rewards[e]
            self.terminated[e, slot] = terminated[e]
        self.added += self.num_envs

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(env, slot) of `batch_size` valid transitions, uniform with replacement (rejection from the filled slots;
        every candidate is drawn from `rng`, so the draw is reproducible)."""
        filled = int(min(self.pos.max(), self.n))
        envs = slots = None
        for _ in range(64):
            flat = rng.integers(0, self.num_envs * filled, size=2 * batch_size)
            e, s = flat // filled, flat % filled
            ok = self.valid[e, s]
            e, s = e[ok], s[ok]
            envs, slots = (e, s) if envs is None else (np.concatenate([envs, e]), np.concatenate([slots, s]))
            if len(envs) >= batch_size:
                return envs[:batch_size], slots[:batch_size]
        where = np.flatnonzero(self.valid[:, :filled])  # few valid slots (just after a clear): draw among them
        if not len(where):
            raise RuntimeError("replay buffer: no transition to sample")
        flat = where[rng.integers(0, len(where), size=batch_size)]
        return flat // filled, flat % filled

    def gather(self, envs: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, ...]:
        """(obs, actions, rewards, terminated, next_obs) of the transitions at (env, slot)."""
        window = self.frames[envs[:, None], (slots[:, None] + np.arange(-self.k, 1)) % self.n]
        b = len(envs)
        obs = self.read(window[:, :-1].reshape((b,) + self.obs_shape))
        next_obs = self.read(window[:, 1:].reshape((b,) + self.obs_shape))
        return obs, self.actions[envs, slots], self.rewards[envs, slots], self.terminated[envs, slots], next_obs

    def gather_obs(self, envs: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """`gather`'s obs alone (C-CHAIN's reference batch): the same frames, half the copying."""
        window = self.frames[envs[:, None], (slots[:, None] + np.arange(-self.k, 0)) % self.n]
        return self.read(window.reshape((len(envs),) + self.obs_shape))

    def read(self, frames: np.ndarray) -> np.ndarray:
        """Stored frames as the observations they were (bools back to the observation dtype)."""
        return frames.astype(self.obs_dtype) if self.binary else frames

    def state_dict(self) -> dict:
        return {"frames": torch.from_numpy(self.frames), "actions": torch.from_numpy(self.actions),
                "rewards": torch.from_numpy(self.rewards), "terminated": torch.from_numpy(self.terminated),
                "valid": torch.from_numpy(self.valid), "pos": torch.from_numpy(self.pos), "added": self.added}

    def load_state_dict(self, state: dict) -> None:
        for name in ("frames", "actions", "rewards", "terminated", "valid", "pos"):
            getattr(self, name)[...] = state[name].numpy()
        if self.binary and state["frames"].dtype != torch.bool and \
                not np.array_equal(self.frames, state["frames"].numpy()):
            raise TrainingError("replay buffer: the checkpoint's observations are not 0/1 (a buffer of bools)")
        self.added = int(state["added"])
        self.fresh[:] = True  # the envs were reset by the resume


def make_replay(args: Args, obs_space) -> ReplayBuffer:
    """The run's replay buffer; MinAtar's observations (0/1 grids, zero padding included) stored as bools."""
    return ReplayBuffer(args.buffer_size, args.num_envs, obs_space.shape, obs_space.dtype,
                        binary=args.backend == "MinAtar")


# how DQN meets the continual methods (continual/methods.py): C-CHAIN on the Q-values of a second replay batch
CONTINUAL = AgentForm(plasticity=True, c_chain=ChurnForm(DQN_SCHEDULE, lambda net, x: net(x), q_churn))


def checkpoint_replay(session, rb: ReplayBuffer, args: Args) -> None:
    """The replay buffer in every checkpoint with --save_replay_buffer; a resumed run without one says so."""
    session.register("replay", lambda: rb.state_dict() if args.save_replay_buffer else None, rb.load_state_dict,
                     optional=True)
    if session.resuming and session.resume_state.get("replay") is None:
        print(f"resume: the checkpoint has no replay buffer (--save_replay_buffer): training resumes after "
              f"{args.learning_starts} new transitions")


class RegimeStart(Extension):
    """What DQN does at a switch: the regime's start step (--learning_starts_each_regime), --reset_replay_on_switch,
    --epsilon_rewarm_on_switch."""

    def __init__(self, args: Args, rb: ReplayBuffer):
        self.args, self.rb = args, rb
        self.explore_from = 0  # the step the epsilon decay started from (moved by --epsilon_rewarm_on_switch)
        self.regime_start = 0  # the step the current regime started at (--learning_starts_each_regime)

    def attach(self, session) -> None:
        super().attach(session)  # its state in every checkpoint (regime_start: older checkpoints lack it)
        session.register("explore_from", lambda: self.explore_from, lambda step: setattr(self, "explore_from", step))
        session.register("regime_start", lambda: self.regime_start, lambda step: setattr(self, "regime_start", step),
                         optional=True)

    def on_switch_end(self, event) -> None:
        self.regime_start = event.global_step
        if self.args.reset_replay_on_switch:
            self.rb.clear()
        if self.args.epsilon_rewarm_on_switch:
            self.explore_from = event.global_step


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> str:
    iteration_size = args.rollout_size()  # num_envs x num_steps agent steps between two curriculum questions
    session = start_run(args, curriculum, resume_state, granularity=iteration_size)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    rng = session.np_rng  # exploration and replay sampling: checkpointed with the session

    # env setup
    settings = EnvSettings.from_args(args, video_dir=session.video_dir, regimes=session.regimes,
                                     start_step=session.global_step)
    envs = session.closing(make_vector_env(settings, args.num_envs, session.modification, args.vector_env))
    with session.running():
        obs_space, n_actions = envs.single_observation_space, envs.single_action_space.n
        q_network = make_agent(obs_space, envs.single_action_space, args).to(device)
        set_torch_threads(args, q_network.obs_shape)
        # --fused_adam: one kernel per parameter (the same update up to float rounding); else foreach, the default on
        # GPUs, which on a CPU runs the single-tensor default's kernels, bit for bit, from one call per operation
        optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate,
                               **({"fused": True} if args.fused_adam else {"foreach": True}))
        target_network = make_agent(obs_space, envs.single_action_space, args).to(device)
        target_network.load_state_dict(q_network.state_dict())
        reward_scaler = RewardScaler(args.reward_scaling, args.num_envs, args.gamma)
        rb = make_replay(args, obs_space)
        print(f"replay buffer: {args.buffer_size} transitions, {rb.bytes_per_transition()} bytes each "
              f"({args.buffer_size * rb.bytes_per_transition() / 1e9:.2f} GB when full)")
        at_switch = RegimeStart(args, rb)

        # what a checkpoint holds: the model, target network and optimizer (add_continual registers them), the regime's
        # start (RegimeStart), the reward scaler, the replay buffer with --save_replay_buffer; a resumed run loads each
        # now. Continual behaviour: plasticity methods (the target network injected too), C-CHAIN, evaluation
        ext = add_continual(session, q_network, optimizer, CONTINUAL, make_agent, (obs_space, envs.single_action_space),
                            device=device, followers={"target_model": target_network}, last=[at_switch])
        session.register("reward_scaler", reward_scaler.state_dict, reward_scaler.load_state_dict)
        checkpoint_replay(session, rb, args)

        # TRY NOT TO MODIFY: start the game
        global_step = session.global_step
        obs, _ = envs.reset(seed=args.seed + global_step)
        rb.begin(range(args.num_envs))
        epsilon_duration = args.exploration_fraction * session.total_timesteps
        # --learning_starts_each_regime: random steps and no training for the first learning_starts steps of every
        # regime; epsilon counts from the end of the first of them
        random_phase = args.learning_starts if args.learning_starts_each_regime else 0

        for iteration in session.iterations():  # resumed: RNGs as the checkpoint had them
            switched_obs = session.maybe_switch(envs)
            if switched_obs is not None:  # new episodes: the cut transition was stored with its real next obs
                obs = switched_obs
                rb.begin(range(args.num_envs))
                reward_scaler.episodes_cut()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / session.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            t_iteration = time.time()
            env_time = learn_time = 0.0
            losses, q_means, seen = [], [], []
            for step in range(args.num_steps):
                epsilon = linear_schedule(args.start_e, args.end_e, epsilon_duration,
                                          max(global_step - at_switch.explore_from - random_phase, 0))
                in_random_phase = global_step - at_switch.regime_start < random_phase
                global_step += args.num_envs
                session.global_step = global_step

                # ALGO LOGIC: epsilon-greedy, one coin per env
                explore = rng.random(args.num_envs) < epsilon
                actions = rng.integers(0, n_actions, size=args.num_envs)
                if not (explore.all() or in_random_phase):
                    with torch.inference_mode():  # no autograd bookkeeping at all: the same Q-values, sooner
                        greedy = q_network(torch.as_tensor(obs, device=device)).argmax(1).cpu().numpy()
                    actions = np.where(explore, actions, greedy)
                seen.append(torch.as_tensor(obs))

                # TRY NOT TO MODIFY: execute the game and log data.
                t_env = time.time()
                next_obs, reward, terminations, truncations, infos = envs.step(actions)
                env_time += time.time() - t_env
                done = np.logical_or(terminations, truncations)
                scaled = reward_scaler(reward, done)
                real_next_obs = next_obs.copy()  # SAME_STEP autoreset: next_obs of a finished episode is a reset one
                for i in np.flatnonzero(done):
                    real_next_obs[i] = infos["final_obs"][i]
                rb.add(obs, real_next_obs, actions, scaled, terminations)
                rb.begin(np.flatnonzero(done))
                obs = next_obs
                for _, ep_return, ep_length in episode_stats(infos):
                    session.episode(ep_return, ep_length, global_step)

                # ALGO LOGIC: training
                if rb.added > args.learning_starts and global_step - at_switch.regime_start > random_phase:
                    t_learn = time.time()
                    previous = global_step - args.num_envs
                    for _ in range(global_step // args.train_frequency - previous // args.train_frequency):
                        envs_i, slots = rb.sample_indices(args.replay_batch_size, rng)
                        b_obs, b_actions, b_rewards, b_terminated, b_next = (
                            torch.as_tensor(x, device=device) for x in rb.gather(envs_i, slots))
                        with torch.no_grad():
                            target = td_target(b_rewards, b_terminated, args.gamma, target_network(b_next),
                                               q_network(b_next) if args.double_dqn else None)
                        old_val = q_network(b_obs).gather(1, b_actions.long().unsqueeze(1)).squeeze(1)
                        loss = F.mse_loss(target, old_val)
                        check_losses(global_step, td_loss=loss)
                        # L2 / L2 Init / Parseval, C-CHAIN's churn on a second replay batch
                        total = ext.loss(loss, q_network, {"main_loss": loss, "reference_obs": lambda: torch.as_tensor(
                            rb.gather_obs(*rb.sample_indices(args.replay_batch_size, rng)), device=device)})
                        optimizer.zero_grad()
                        total.backward()
                        ext.before_step()  # gradient norms (diagnostics); C-CHAIN's next reference: these weights
                        optimizer.step()
                        ext.after_step(optimizer)  # NaP's norms
                        ext.after_update({"obs": b_obs})  # ReDo (on this replay batch), layer resets, when due
                        losses.append(loss.detach())
                        q_means.append(old_val.detach().mean())
                    if global_step // args.target_network_frequency != previous // args.target_network_frequency:
                        with torch.no_grad():
                            for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                                target_param.copy_(args.tau * q_param + (1.0 - args.tau) * target_param)
                    learn_time += time.time() - t_learn
            ext.observe({"obs": torch.stack(seen).to(device)})  # the monitor's probe (from the first iteration)
            check_parameters(q_network, global_step)
            iteration_time = time.time() - t_iteration

            session.end_iteration(iteration, {
                "charts/learning_rate": optimizer.param_groups[0]["lr"], "charts/epsilon": epsilon,
                "losses/td_loss": float(torch.stack(losses).mean()) if losses else math.nan,
                "losses/q_values": float(torch.stack(q_means).mean()) if q_means else math.nan,
                "charts/updates": len(losses), "charts/replay_size": len(rb),
                "time/env_s": env_time, "time/learn_s": learn_time,
                "time/act_s": iteration_time - env_time - learn_time,
            })
    return session.run_dir


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "DQN", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
