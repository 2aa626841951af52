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

Spec (continual/specs.py):
- its defaults are Args' (CleanRL's ppo_atari)
- supports: act_threads, adam_betas, bf16, box_actions, c_chain, compile, ewc, fused_adam, her, mlp_network,
  network_options, norm_obs, plasticity, shrink_and_perturb, trac
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, Sequence

if __package__ in (None, ""):  # `python agents/ppo.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
import torch.nn as nn

from agents.networks import (  # noqa: F401  (agents.ppo.Agent, ... as before they moved)
    Agent,
    ContiguousReLU,
    action_dims,
    categorical,
    layer_init,
    make_agent,
    obs_scale,
    policy_head,
)
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.envs.goals import split_goal_space
from continual.envs.vector import EnvSettings, episode_stats, make_vector_env
from continual.methods import AgentForm, EWCForm, add_continual
from continual.plasticity.c_chain import PPO_SCHEDULE, ChurnForm, policy_churn
from continual.plasticity.methods import plastic_optimizer
from continual.training.accel import compile_step
from continual.training.extensions import Extension
from continual.training.guards import check_losses, check_parameters
from continual.training.rewards import RewardScaler
from continual.training.startup import acting_threads, agent_main, set_torch_threads, start_run


def ewc_batch_loss(args: Args):
    """EWC's `--ewc_fisher cora` loss (CORA's checkpoint_task, pg + value loss without entropy, summed over the batch
    as CORA's): -sum A log pi(a|s) (the clipped surrogate's gradient at ratio 1) + vf_coef/2 sum (R - V)^2."""
    def loss(agent: "Agent", batch: dict) -> torch.Tensor:
        _, logprob, _, value = agent.get_action_and_value(batch["obs"], batch["action"])
        return (-(batch["advantage"] * logprob).sum()
                + args.vf_coef * 0.5 * ((value.view(-1) - batch["return"]) ** 2).sum())
    return loss


# how PPO meets the continual methods (continual/methods.py)
CONTINUAL = AgentForm(
    ewc=EWCForm(policy_head, ewc_batch_loss),
    plasticity=True,
    c_chain=ChurnForm(PPO_SCHEDULE, lambda net, x: net.actor(net.features(x)).float(), policy_churn,
                      per_iteration=True, refuse_box_actions=True),
    her=True,
)


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, next_value: torch.Tensor,
        next_done: torch.Tensor, gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """CleanRL's generalised advantage estimation over a (steps, envs) rollout: (advantages, returns). With
    gae_lambda 1 the advantages are those of n-step returns (A2C's)."""
    # every step's delta and discount at once (the same elementwise operations in the same order, so the same bits;
    # only the recursion runs step by step)
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.reshape(1, -1)])
    nextvalues = torch.cat([values[1:], next_value.reshape(1, -1)])
    deltas = rewards + gamma * nextvalues * nextnonterminal - values
    discounts = gamma * gae_lambda * nextnonterminal
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):
        advantages[t] = lastgaelam = deltas[t] + discounts[t] * lastgaelam
    return advantages, advantages + values


@torch.no_grad()
def act(agent: Agent, obs: torch.Tensor, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The act step: the policy's (action, log-prob, value) at a batch of observations (HER: `inputs` holds the goal).
    --compile compiles it, --cudagraphs replays it as a CUDA graph."""
    action, logprob, _, value = agent.get_action_and_value(obs, **inputs, with_entropy=False)
    return action, logprob, value.flatten()


def ppo_loss(agent: Agent, args: Args, mb_obs: torch.Tensor, mb_inputs: dict, mb_mean: Callable,
             mb_actions: torch.Tensor, mb_logprobs: torch.Tensor, mb_advantages: torch.Tensor, mb_returns: torch.Tensor,
             mb_values: torch.Tensor):
    """CleanRL's clipped-surrogate loss of one minibatch, the update's forward pass: (loss, pg_loss, v_loss,
    entropy_loss, old_approx_kl, approx_kl, clipfrac). `mb_mean`: the mean of per-sample losses (torch.mean; HER
    weights its relabelled samples). --compile compiles it (and so its backward)."""
    with torch.autocast(mb_values.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, mb_actions, **mb_inputs)
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = mb_mean(torch.max(pg_loss1, pg_loss2))

    # Value loss
    newvalue = newvalue.view(-1)
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * mb_mean(torch.max(v_loss_unclipped, v_loss_clipped))
    else:
        v_loss = 0.5 * mb_mean((newvalue - mb_returns) ** 2)

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return loss, pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None,
          make_agent_fn: Callable[..., Agent] = make_agent,
          make_extensions: Callable[[Agent], Sequence[Extension]] = lambda agent: ()) -> str:
    """Train through the curriculum; `make_agent_fn` lets PPO variants (PPO_CBP) bring their own network,
    `make_extensions(agent)` their `Extension`s (after HER's, which `add_continual` adds with --her)."""
    batch_size = args.rollout_size()
    minibatch_size = args.minibatch_size()
    session = start_run(args, curriculum, resume_state, granularity=batch_size)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    settings = EnvSettings.from_args(args, video_dir=session.video_dir, regimes=session.regimes,
                                     start_step=session.global_step)
    envs = session.closing(make_vector_env(settings, args.num_envs, session.modification, args.vector_env))
    with session.running():
        agent = make_agent_fn(envs.single_observation_space, envs.single_action_space, args).to(device)
        set_torch_threads(args, agent.obs_shape)
        optimizer = plastic_optimizer(agent.make_optimizer(args.learning_rate, (args.adam_beta1, args.adam_beta2),
                                                           fused=args.fused_adam), args)  # --trac wraps it
        reward_scaler = RewardScaler(args.reward_scaling, args.num_envs, args.gamma)
        # what a checkpoint holds: the model and optimizer (add_continual registers them), the reward scaler; a
        # resumed run loads each now. Continual behaviour: HER, the variant's, EWC, plasticity methods, C-CHAIN,
        # evaluation (continual/methods.py)
        session.register("reward_scaler", reward_scaler.state_dict, reward_scaler.load_state_dict)
        spaces = (envs.single_observation_space, envs.single_action_space)
        ext = add_continual(session, agent, optimizer, CONTINUAL, make_agent_fn, spaces, device=device,
                            continuous=agent.continuous, first=make_extensions(agent))
        # the act step and the update's forward + loss: eager, or compiled (--compile) and replayed as CUDA graphs
        # (--cudagraphs), LeanRL's approach (continual/training/accel.py)
        act_step = compile_step(lambda x, inputs: act(agent, x, inputs), args)
        update_loss = compile_step(lambda *minibatch: ppo_loss(agent, args, *minibatch), args)

        # ALGO Logic: storage setup (pixel observations stay uint8: a 4x smaller buffer to gather minibatches from)
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

        # TRY NOT TO MODIFY: start the game
        global_step = session.global_step
        # where observations enter the agent: the stored observation and the policy's extra inputs (HER: the goal)
        next_obs, next_inputs = ext.agent_inputs(envs.reset(seed=args.seed + global_step)[0])
        next_done = torch.zeros(args.num_envs).to(device)

        for iteration in session.iterations():  # resumed: RNGs as the checkpoint had them
            switched_obs = session.maybe_switch(envs)
            if switched_obs is not None:
                next_obs, next_inputs = ext.agent_inputs(switched_obs)
                next_done = torch.zeros(args.num_envs).to(device)
                reward_scaler.episodes_cut()

            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / session.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            t_rollout = time.time()
            env_time = forward_time = 0.0
            with acting_threads(args):  # --act_threads while acting, the update's threads after
                for step in range(args.num_steps):
                    global_step += args.num_envs
                    session.global_step = global_step
                    obs[step] = next_obs
                    dones[step] = next_done

                    # ALGO LOGIC: action logic
                    t_forward = time.time()
                    action, logprob, values[step] = act_step(next_obs, next_inputs)
                    forward_time += time.time() - t_forward
                    actions[step] = action
                    logprobs[step] = logprob

                    # TRY NOT TO MODIFY: execute the game and log data.
                    t_env = time.time()
                    next_obs_raw, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                    env_time += time.time() - t_env
                    done = np.logical_or(terminations, truncations)
                    # the next observation, the rewards to train on, the envs whose episode hit its time limit and what
                    # it ended on (HER: the goal leaves the observation, goal rewards)
                    next_obs, next_inputs, scaled, cut, final = ext.env_step(
                        step, next_obs_raw, reward_scaler(reward, done), terminations, truncations, infos)
                    next_done = torch.as_tensor(done, dtype=torch.float32, device=device)
                    if len(cut):  # time limit: bootstrap from the value of the observation the episode ended on
                        final_obs, final_inputs = final
                        with torch.no_grad():
                            final_values = agent.get_value(final_obs, **final_inputs).flatten().cpu().numpy()
                        scaled[cut] += args.gamma * final_values
                    rewards[step] = torch.as_tensor(scaled, device=device)
                    for i, ep_return, ep_length in episode_stats(infos):
                        session.episode(ep_return, ep_length, global_step, env=i)
            rollout_time = time.time() - t_rollout

            # bootstrap value if not done
            t_learn = time.time()
            with torch.no_grad():
                next_value = agent.get_value(next_obs, **next_inputs).reshape(1, -1)
                advantages, returns = gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)

            # flatten the batch
            b_obs = obs.reshape((-1,) + obs_space.shape)
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape((-1,) + action_shape)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)
            # the data trained on goes to the extensions (the monitor's probe, EWC's Fisher samples, CBP's capture),
            # which may add samples (HER's relabelled ones) and their own minibatch size
            batch = ext.update_batch(agent, {
                "obs": b_obs, "logprobs": b_logprobs, "actions": b_actions, "advantages": b_advantages,
                "returns": b_returns, "values": b_values, "size": batch_size, "minibatch_size": minibatch_size,
            }, rollout={"obs": obs, "actions": actions, "logprobs": logprobs, "dones": dones, "next_obs": next_obs},
                observed={"obs": obs, "obs_shape": obs_space.shape, "rows": {
                    "obs": b_obs, "action": b_actions, "advantage": b_advantages, "return": b_returns}})
            b_logprobs, b_actions, b_advantages = batch["logprobs"], batch["actions"], batch["advantages"]
            b_returns, b_values = batch["returns"], batch["values"]

            # Optimizing the policy and value network
            b_inds = np.arange(batch["size"])
            clipfracs = []
            for epoch in range(args.update_epochs):
                session.np_rng.shuffle(b_inds)
                for start in range(0, batch["size"], batch["minibatch_size"]):
                    mb_inds = torch.as_tensor(b_inds[start:start + batch["minibatch_size"]], device=device)
                    # its observations, the policy's extra inputs and the mean of per-sample losses (torch.mean; HER:
                    # the goals, and its relabelled samples' importance weights in the policy and value losses)
                    mb_obs, mb_inputs, mb_mean = ext.minibatch(batch, mb_inds)

                    # each row gathered once (index_select: the same values, faster than indexing on CPU)
                    mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values = (
                        x.index_select(0, mb_inds) for x in (b_actions, b_logprobs, b_advantages, b_returns, b_values))

                    loss, pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac = update_loss(
                        mb_obs, mb_inputs, mb_mean, mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values)
                    clipfracs += [clipfrac.item()]
                    # EWC's penalty, L2 / L2 Init / Parseval, C-CHAIN's churn (on a permutation of its own)
                    total = ext.loss(loss, agent, {"batch": batch, "start": start, "size": batch["minibatch_size"],
                                                   "main_loss": pg_loss})
                    check_losses(global_step, value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss,
                                 combined=loss)

                    optimizer.zero_grad()
                    total.backward()
                    ext.before_step()  # gradient norms (diagnostics); C-CHAIN's next reference: these weights
                    # foreach: the norms in one call on CPU too (the same numbers)
                    nn.utils.clip_grad_norm_(agent.parameters(), args.grad_clip_norm(), foreach=True)
                    optimizer.step()
                    ext.after_step(optimizer)  # NaP's norms, PPO_CBP's units

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            ext.after_update({"obs": obs})  # ReDo, layer resets, when due
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
                "time/env_s": env_time, "time/act_s": rollout_time - env_time, "time/forward_s": forward_time,
                "time/learn_s": learn_time,
            })  # the extensions' scalars join (EWC's penalty, units recycled, C-CHAIN's coefficient, HER's success)
    return session.run_dir


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "PPO", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
