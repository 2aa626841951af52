"""PPO with Continual Backpropagation (PPO_CBP): the PPO of `agents/ppo.py` whose hidden layers are maintained by
CBP (`continual/plasticity/cbp.py`, Dohare et al., Nature 2024).

    python continual_training_example.py --config run_config.json --architecture PPO_CBP \
        --replacement_rate 1e-4 --maturity_threshold 10000 --decay_rate 0.99 --init kaiming

Tracked layers: the 3 conv layers and the 512-unit fully connected layer for pixels, the two hidden layers of the
MLP otherwise. The last hidden layer feeds both heads and is tracked once, over the actor AND critic weights.
CBP runs after every optimizer update (ages count updates, whatever the batch and minibatch sizes). The optimizer is
AdamGnT, Adam with a step count per weight (same hyper-parameters as PPO's Adam), so that a replaced weight restarts
its bias correction with its moments. HER on pixels: the fused layer's units are fed by the image features AND the
goal; a replaced unit gets both rows re-initialised.

Presets: the seed project's values are the defaults (--replacement_rate 1e-5 --maturity_threshold 100
--decay_rate 0.99); the paper's RL values are --replacement_rate 1e-4 --maturity_threshold 10000 --decay_rate 0.99.

Spec (continual/specs.py):
- its defaults are Args' (CleanRL's ppo_atari)
- supports: act_threads, adam_betas, bf16, box_actions, c_chain, ewc, her, norm_obs, plasticity, shrink_and_perturb
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

if __package__ in (None, ""):  # `python agents/ppo_cbp.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch.nn as nn
import torch.optim as optim

from agents import networks, ppo
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.envs.goals import split_goal_space
from continual.plasticity.cbp import CBP, AdamGnT, UnitTracker
from continual.training.extensions import Extension
from continual.training.startup import agent_main


class CBPAgent(networks.Agent):
    """networks.Agent plus one CBP unit tracker per hidden layer."""

    def __init__(self, obs_shape: Sequence[int], n_actions: int, args: Args, obs_scale: float = 1.0,
                 goal_dim: int = 0, continuous: bool = False, norm_obs: bool = False):
        super().__init__(obs_shape, n_actions, obs_scale=obs_scale, goal_dim=goal_dim, continuous=continuous,
                         norm_obs=norm_obs)
        # (incoming layer, its activation) pairs of the torso, in order
        mods = list(self.network)
        pairs = [(m, mods[i + 1]) for i, m in enumerate(mods) if isinstance(m, (nn.Linear, nn.Conv2d))]
        if hasattr(self, "goal_fusion"):  # HER (pixels): the goal-fused layer is the last hidden layer
            pairs.append((self.goal_fusion, self.goal_act))
        trackers = []
        for i, (layer, act) in enumerate(pairs):
            outs = [pairs[i + 1][0]] if i + 1 < len(pairs) else [self.actor, self.critic]
            extra = [self.goal_embed] if hasattr(self, "goal_fusion") and layer is self.goal_fusion else []
            trackers.append(UnitTracker(f"layer{i}", layer, act, outs, args.replacement_rate,
                                        args.maturity_threshold, args.decay_rate, args.init, args.utility,
                                        extra_in_layers=extra))
        self.cbp = CBP(trackers)

    def make_optimizer(self, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                       fused: bool = False) -> optim.Optimizer:
        if fused:  # validation refuses --fused_adam for PPO_CBP before this
            raise ValueError("PPO_CBP's AdamGnT has no fused kernel")
        return AdamGnT(self.parameters(), lr=lr, betas=betas, eps=1e-5)  # PPO's Adam, with a step count per weight


def make_agent(obs_space, action_space, args: Args) -> CBPAgent:
    obs_space, goal_dim = split_goal_space(obs_space)  # HER: Dict observations carry the goal
    n_actions, continuous = networks.action_dims(action_space)  # Box actions: the Gaussian head of Agent
    return CBPAgent(obs_space.shape, n_actions, args, obs_scale=networks.obs_scale(obs_space, args), goal_dim=goal_dim,
                    continuous=continuous, norm_obs=args.norm_obs)


class CBPExtension(Extension):
    """CBP reaches PPO's loop as an extension: unit activations are captured during the update, and units are
    maintained after every optimizer step."""

    def __init__(self, agent: CBPAgent):
        self.agent = agent

    def before_update(self) -> None:
        self.agent.cbp.capture(True)

    def after_step(self, optimizer: optim.Optimizer) -> None:
        self.agent.cbp.step(optimizer)

    def after_update(self, batch: dict) -> None:
        self.agent.cbp.capture(False)


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> str:
    return ppo.train(args, curriculum, resume_state, make_agent_fn=make_agent,
                     make_extensions=lambda agent: [CBPExtension(agent)])


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "PPO_CBP", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
