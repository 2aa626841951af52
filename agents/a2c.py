"""Continual A2C: synchronous advantage actor-critic trained through a curriculum of environment modifications.

Run it directly (`python agents/a2c.py --config configs/a2c_atari.json`) or through
`python continual_training_example.py --architecture A2C`. The algorithm reads top to bottom in `train()`:
rollout of `--num_steps` steps in `--num_envs` envs -> advantages -> one RMSprop step on
policy-gradient + `--vf_coef` x value - `--ent_coef` x entropy (Mnih et al. 2016, synchronous as in OpenAI baselines
and SB3). The network is agents/networks.py's Agent (Nature CNN or MLP, shared torso, actor and critic heads).

- advantages: GAE(`--gae_lambda`) over the rollout; `--gae_lambda 1` gives A2C's n-step returns (baselines, SB3);
  they are constants in the policy loss (the critic learns only from its own loss: no gradient through the
  advantage or the bootstrap target), one value per state (a scalar critic), one per sample (no (N, 1) x (N,)
  broadcast); `--norm_adv` standardises them per rollout (SB3's normalize_advantage);
- value loss: the mean squared error to the returns (baselines/SB3), gradient-norm clipping `--max_grad_norm`;
- RMSprop with `--rmsprop_alpha` and `--rmsprop_eps` (baselines/SB3: 0.99 and 1e-5), no momentum; the learning
  rate anneals linearly over the whole run with `--anneal_lr` (baselines' default schedule).

Continual specifics (as agents/ppo.py): at a switch the envs change in place and reset; the episode cut by the switch
is bootstrapped from the value of the last observation, never treated as a termination; time-limit truncations are
bootstrapped from the value of the final observation; RMSprop's state carries across switches (unless
`--reset_optimizer_on_switch`). Actions are sampled with the global torch generator, which the checkpoint restores
after the network is built: on CPU a resumed run continues exactly as the uninterrupted one from a switch checkpoint
(the envs restart their episodes at a resume).

Spec (continual/specs.py):
- its own defaults: --learning_rate 0.0007 --num_envs 16 --num_steps 5 --gae_lambda 1.0 --no-norm_adv --vf_coef 0.25 --rmsprop_eps 1e-05
- supports: mlp_network, norm_obs, shrink_and_perturb
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, Sequence

if __package__ in (None, ""):  # `python agents/a2c.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from agents import networks
from agents.ppo import gae
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.envs.vector import EnvSettings, episode_stats, make_vector_env
from continual.methods import AgentForm, add_continual
from continual.training.guards import check_losses, check_parameters
from continual.training.rewards import RewardScaler
from continual.training.startup import agent_main, set_torch_threads, start_run


def make_agent(obs_space, action_space, args: Args) -> networks.Agent:
    """agents/networks.py's actor-critic network (module-level here so that the background evaluator pickles it)."""
    return networks.make_agent(obs_space, action_space, args)


# how A2C meets the continual methods (continual/methods.py): the monitor, switch remedies and evaluation only
CONTINUAL = AgentForm()


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> str:
    batch_size = args.rollout_size()
    session = start_run(args, curriculum, resume_state, granularity=batch_size)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    settings = EnvSettings.from_args(args, video_dir=session.video_dir, regimes=session.regimes,
                                     start_step=session.global_step)
    envs = session.closing(make_vector_env(settings, args.num_envs, session.modification, args.vector_env))
    with session.running():
        agent = make_agent(envs.single_observation_space, envs.single_action_space, args).to(device)
        set_torch_threads(args, agent.obs_shape)
        optimizer = optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=args.rmsprop_alpha,
                                  eps=args.rmsprop_eps)
        reward_scaler = RewardScaler(args.reward_scaling, args.num_envs, args.gamma)
        # what a checkpoint holds: the model and optimizer (add_continual registers them), the reward scaler; a
        # resumed run loads each now. Continual behaviour: diagnostics, shrink & perturb, evaluation
        session.register("reward_scaler", reward_scaler.state_dict, reward_scaler.load_state_dict)
        spaces = (envs.single_observation_space, envs.single_action_space)
        ext = add_continual(session, agent, optimizer, CONTINUAL, make_agent, spaces, device=device)

        # ALGO Logic: storage setup (pixel observations stay uint8)
        obs_space = envs.single_observation_space
        obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        obs = torch.zeros((args.num_steps, args.num_envs) + obs_space.shape, dtype=obs_dtype).to(device)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long).to(device)
        rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
        dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
        values = torch.zeros((args.num_steps, args.num_envs)).to(device)

        # TRY NOT TO MODIFY: start the game
        global_step = session.global_step
        next_obs = torch.as_tensor(envs.reset(seed=args.seed + global_step)[0], device=device)
        next_done = torch.zeros(args.num_envs).to(device)

        for iteration in session.iterations():  # resumed: RNGs as the checkpoint had them
            switched_obs = session.maybe_switch(envs)
            if switched_obs is not None:  # the cut episodes bootstrap from the last value of the previous rollout
                next_obs = torch.as_tensor(switched_obs, device=device)
                next_done = torch.zeros(args.num_envs).to(device)
                reward_scaler.episodes_cut()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / session.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            t_rollout = time.time()
            env_time = 0.0
            for step in range(args.num_steps):
                global_step += args.num_envs
                session.global_step = global_step
                obs[step] = next_obs
                dones[step] = next_done

                # ALGO LOGIC: action logic
                with torch.no_grad():
                    action, _, _, value = agent.get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action

                # TRY NOT TO MODIFY: execute the game and log data.
                t_env = time.time()
                next_obs_np, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                env_time += time.time() - t_env
                done = np.logical_or(terminations, truncations)
                scaled = reward_scaler(reward, done)
                cut = np.flatnonzero(truncations & ~terminations)
                if len(cut):  # time limit: bootstrap from the value of the observation the episode ended on
                    final = torch.as_tensor(np.stack([infos["final_obs"][i] for i in cut]), device=device)
                    with torch.no_grad():
                        scaled[cut] += args.gamma * agent.get_value(final).flatten().cpu().numpy()
                rewards[step] = torch.as_tensor(scaled, device=device)
                next_obs = torch.as_tensor(next_obs_np, device=device)
                next_done = torch.as_tensor(done, dtype=torch.float32, device=device)
                for _, ep_return, ep_length in episode_stats(infos):
                    session.episode(ep_return, ep_length, global_step)
            rollout_time = time.time() - t_rollout
            ext.observe({"obs": obs, "obs_shape": obs_space.shape})  # the monitor's probe

            # advantages (constants of the update)
            t_learn = time.time()
            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(-1)
                advantages, returns = gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
            b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
            if args.norm_adv:
                b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)

            # one gradient step on the whole rollout
            _, logprob, entropy, newvalue = agent.get_action_and_value(obs.reshape((-1,) + obs_space.shape),
                                                                       actions.reshape(-1))
            pg_loss = -(b_advantages * logprob).mean()
            v_loss = ((newvalue.view(-1) - b_returns) ** 2).mean()
            entropy_loss = entropy.mean()
            a2c_loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
            loss = ext.loss(a2c_loss, agent, {"main_loss": pg_loss})  # the extensions' terms (none of A2C's adds one)
            check_losses(global_step, value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss,
                         combined=a2c_loss)
            optimizer.zero_grad()
            loss.backward()
            ext.before_step()  # gradient norms (diagnostics)
            nn.utils.clip_grad_norm_(agent.parameters(), args.grad_clip_norm())
            optimizer.step()
            ext.after_step(optimizer)
            ext.after_update({"obs": obs})
            if agent.norm_obs:  # after the update, as in agents/ppo.py
                agent.update_obs_stats(obs)
            check_parameters(agent, global_step)

            y_pred, y_true = values.reshape(-1).cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
            session.end_iteration(iteration, {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "losses/value_loss": v_loss.item(), "losses/policy_loss": pg_loss.item(),
                "losses/entropy": entropy_loss.item(), "losses/explained_variance": float(explained_var),
                "time/env_s": env_time, "time/act_s": rollout_time - env_time, "time/learn_s": time.time() - t_learn,
            })
    return session.run_dir


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "A2C", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
