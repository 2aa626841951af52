"""Evaluate a policy on whole games (no episodic-life cuts), per modification string."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np
import torch

from continual.envs import ContinualVectorEnv, episode_stats


@dataclasses.dataclass
class EvalResult:
    modification: str
    returns: list[float]
    lengths: list[int]

    def row(self) -> dict:
        r = np.asarray(self.returns, dtype=np.float64)
        return {"modification": self.modification, "episodes": len(r), "mean": float(r.mean()),
                "std": float(r.std()), "min": float(r.min()), "max": float(r.max()),
                "mean_length": float(np.mean(self.lengths))}


@torch.no_grad()
def evaluate(act: Callable[[torch.Tensor], torch.Tensor], envs: ContinualVectorEnv, episodes: int,
             device: torch.device, seed: int, max_steps: int = 10_000_000,
             on_episode: Optional[Callable[[], None]] = None) -> EvalResult:
    """Run until every env has finished its quota of episodes (ceil(episodes / num_envs), the last ones trimmed),
    so short episodes are not over-represented. `act` maps a batch of observations to actions; `on_episode` is
    called once per counted episode (a progress bar)."""
    n = envs.num_envs
    quota = [math.ceil(episodes / n) - (1 if i >= episodes % n and episodes % n else 0) for i in range(n)]
    done_eps: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    obs, _ = envs.reset(seed=seed)
    steps = 0
    while any(len(d) < q for d, q in zip(done_eps, quota)):
        actions = act(torch.as_tensor(obs, device=device)).cpu().numpy()
        obs, _, _, _, infos = envs.step(actions)
        for i, ret, length in episode_stats(infos):
            if len(done_eps[i]) < quota[i]:
                done_eps[i].append((ret, length))
                if on_episode is not None:
                    on_episode()
        steps += n
        if steps > max_steps:
            raise RuntimeError(f"evaluation did not finish {episodes} episodes within {max_steps} steps")
    flat = [e for d in done_eps for e in d]
    return EvalResult(envs.modification, [r for r, _ in flat], [l for _, l in flat])
