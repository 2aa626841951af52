"""The one episode loop: a policy plays whole games (no episodic-life cuts) under one modification string. Goal
envs (`--her`, Dict observations) add each episode's success and closest goal distance."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import gymnasium as gym
import numpy as np
import torch

from continual.envs.goals import episode_outcomes
from continual.envs.vector import ContinualVectorEnv, episode_stats


@dataclasses.dataclass
class EvalResult:
    modification: str
    returns: list[float]
    lengths: list[int]
    successes: Optional[list[float]] = None  # goal envs only (nan: the episode reported no outcome)
    distances: Optional[list[float]] = None
    max_episode_steps: Optional[int] = None  # the cap the games were played under (None: whole games)
    capped: int = 0  # games cut short by that cap (a time-limit truncation, not the game's own end)
    action_counts: Optional[list[int]] = None  # count_actions: each discrete action's count over the counted games

    def row(self) -> dict:
        r = np.asarray(self.returns, dtype=np.float64)
        row = {"modification": self.modification, "episodes": len(r), "mean": float(r.mean()),
               "std": float(r.std()), "min": float(r.min()), "max": float(r.max()),
               "mean_length": float(np.mean(self.lengths)), "max_episode_steps": self.max_episode_steps,
               "capped": self.capped}
        if self.successes is not None:
            row["success_rate"] = float(np.nanmean(self.successes))
            row["goal_distance"] = float(np.nanmean(self.distances))
        if self.action_counts is not None:
            total = max(sum(self.action_counts), 1)
            row["action_share"] = [c / total for c in self.action_counts]
        return row


@torch.no_grad()
def evaluate(act: Callable[..., torch.Tensor], envs: ContinualVectorEnv, episodes: int, device: torch.device,
             seed: Optional[int], max_steps: int = 10_000_000,
             on_episode: Optional[Callable[[], None]] = None, count_actions: bool = False) -> EvalResult:
    """Run until every env has finished its quota of episodes (ceil(episodes / num_envs), the last ones trimmed),
    so short episodes are not over-represented. `act(obs)` maps a batch of observations to actions; on a goal env
    it is called as `act(obs, goals)`. `on_episode` is called once per counted episode (a progress bar). The result
    carries the envs' step cap (`envs.max_episode_steps`) and how many games it cut short; `count_actions` (a
    discrete action space): how often each action was taken in the games it counts (a policy that drifted off an
    action shows here, e.g. Freeway's UP)."""
    goal_env = isinstance(envs.single_observation_space, gym.spaces.Dict)
    n = envs.num_envs
    quota = [math.ceil(episodes / n) - (1 if i >= episodes % n and episodes % n else 0) for i in range(n)]
    done_eps: list[list[tuple[float, int, float, float, bool]]] = [[] for _ in range(n)]
    outcome: dict[int, tuple[float, float]] = {}
    obs, _ = envs.reset(seed=seed)
    steps = 0
    counts = np.zeros(envs.single_action_space.n, dtype=np.int64) if count_actions else None
    while any(len(d) < q for d, q in zip(done_eps, quota)):
        if goal_env:
            goals = torch.as_tensor(np.asarray(obs["goal"], np.float32), device=device)
            actions = act(torch.as_tensor(obs["obs"], device=device), goals)
        else:
            actions = act(torch.as_tensor(obs, device=device))
        actions = actions.cpu().numpy()
        if counts is not None:  # the envs still playing a counted game
            playing = np.array([len(d) < q for d, q in zip(done_eps, quota)])
            counts += np.bincount(actions[playing], minlength=len(counts))
        obs, _, terminations, truncations, infos = envs.step(actions)
        for i, ok, dist in episode_outcomes(infos):
            outcome[i] = (ok, dist)
        for i, ret, length in episode_stats(infos):
            if len(done_eps[i]) < quota[i]:
                cut = bool(truncations[i]) and not bool(terminations[i])
                done_eps[i].append((ret, length, *outcome.pop(i, (math.nan, math.nan)), cut))
                if on_episode is not None:
                    on_episode()
        steps += n
        if steps > max_steps:
            raise RuntimeError(f"evaluation did not finish {episodes} episodes within {max_steps} steps")
    flat = [e for d in done_eps for e in d]
    cap = getattr(envs, "max_episode_steps", None)
    return EvalResult(envs.modification, [e[0] for e in flat], [e[1] for e in flat],
                      [e[2] for e in flat] if goal_env else None, [e[3] for e in flat] if goal_env else None,
                      max_episode_steps=cap, capped=sum(e[4] for e in flat) if cap is not None else 0,
                      action_counts=counts.tolist() if counts is not None else None)


def agent_policy(agent: torch.nn.Module, greedy: bool = False) -> Callable[..., torch.Tensor]:
    """`act` for `evaluate` from an agent with `get_action_and_value(x, goal=..., greedy=...)` (agents/ppo.py)."""
    def act(x: torch.Tensor, goals: Optional[torch.Tensor] = None) -> torch.Tensor:
        if goals is None:
            return agent.get_action_and_value(x, greedy=greedy)[0]
        return agent.get_action_and_value(x, goal=goals, greedy=greedy)[0]
    return act


def random_policy(num_actions: int, seed: int) -> Callable[..., torch.Tensor]:
    """`act` for `evaluate` that draws each env's action uniformly from `num_actions`, whatever it sees (the
    no-agent baseline of a game), from a generator of its own seeded with `seed`: the same games for the same seed."""
    gen = torch.Generator().manual_seed(int(seed))

    def act(x: torch.Tensor, goals: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.randint(int(num_actions), (x.shape[0],), generator=gen)
    return act


def constant_policy(action: int) -> Callable[..., torch.Tensor]:
    """`act` for `evaluate` that plays `action` every step, whatever it sees: a reflex baseline (Freeway's always UP
    scores ~22 in the unmodified game and ~40 with the cars stopped, so a trained agent's score needs it beside)."""
    def act(x: torch.Tensor, goals: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.full((x.shape[0],), int(action), dtype=torch.long)
    return act
