"""Benchmark: the compute limit of PPO's update, float32 against --bf16 (bfloat16 autocast of the forward pass).

The update alone: CleanRL's 4 epochs x 4 minibatches over a stored rollout of 8 envs x 128 steps (uint8 frames),
with the network and loss of `agents.ppo` (the clipped surrogate, clipped value loss and entropy, gradient clipping,
Adam). Its steps/s (rollout size / update seconds) is what a PPO run could reach if acting and env stepping were
free: the run's steps/s over this number is its share of the compute limit.

Same process, the modes alternate round-robin (the order rotates every repeat); medians with min/max. Also checks
that one bf16 update lands close to the float32 one from the same weights (relative weight-change difference).

Run from the repository root:  python bench/update_limit.py [--repeats 5] [--json bench/results/update_limit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from agents.ppo import Agent  # noqa: E402

SHAPES = {"freeway": ((4, 84, 84), 18), "minatar": ((7, 10, 10), 6)}


def rollout(obs_shape, n_actions, n: int, gen: torch.Generator):
    obs = torch.randint(0, 256, (n,) + obs_shape, dtype=torch.uint8, generator=gen) if obs_shape[1] > 36 \
        else torch.randint(0, 2, (n,) + obs_shape, generator=gen).to(torch.uint8)
    return dict(obs=obs, actions=torch.randint(0, n_actions, (n,), generator=gen),
                logprobs=torch.full((n,), -float(np.log(n_actions))), advantages=torch.randn(n, generator=gen),
                returns=torch.randn(n, generator=gen), values=torch.randn(n, generator=gen))


def update(agent: Agent, opt, b: dict, bf16: bool, epochs: int = 4, minibatches: int = 4, seed: int = 0) -> None:
    n = len(b["actions"])
    rng = np.random.default_rng(seed)
    mb = n // minibatches
    for _ in range(epochs):
        inds = rng.permutation(n)
        for start in range(0, n, mb):
            i = torch.as_tensor(inds[start:start + mb])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                _, logp, ent, v = agent.get_action_and_value(b["obs"][i], b["actions"][i])
            ratio = (logp - b["logprobs"][i]).exp()
            adv = b["advantages"][i]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.9, 1.1)).mean()
            v = v.view(-1)
            vc = b["values"][i] + (v - b["values"][i]).clamp(-0.1, 0.1)
            vl = 0.5 * torch.max((v - b["returns"][i]) ** 2, (vc - b["returns"][i]) ** 2).mean()
            loss = pg - 0.01 * ent.mean() + 0.5 * vl
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--games", default="freeway,minatar")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    results = {"machine": common.machine_info(), "threads": a.threads, "games": {}}
    for game in a.games.split(","):
        obs_shape, n_actions = SHAPES[game]
        b = rollout(obs_shape, n_actions, 1024, torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        base = Agent(obs_shape, n_actions, obs_scale=1 / 255 if game == "freeway" else 1.0)
        # closeness: one update from the same weights in each mode
        moved = {}
        for bf16 in (False, True):
            agent = Agent(obs_shape, n_actions, obs_scale=base.obs_scale)
            agent.load_state_dict(base.state_dict())
            update(agent, torch.optim.Adam(agent.parameters(), 2.5e-4, eps=1e-5), b, bf16)
            moved[bf16] = torch.cat([(p1 - p0).detach().flatten() for p1, p0 in zip(agent.parameters(), base.parameters())])
        rel = float((moved[True] - moved[False]).norm() / moved[False].norm().detach())
        times: dict[str, list[float]] = {"float32": [], "bf16": []}
        loads = []
        for r in range(a.repeats):
            order = common.rotation(["float32", "bf16"], r)
            for mode in order:
                agent = Agent(obs_shape, n_actions, obs_scale=base.obs_scale)
                opt = torch.optim.Adam(agent.parameters(), 2.5e-4, eps=1e-5)
                update(agent, opt, b, mode == "bf16", epochs=1)  # warm-up (oneDNN primitive caches)
                t = time.perf_counter()
                update(agent, opt, b, mode == "bf16", seed=r)
                times[mode].append(time.perf_counter() - t)
            loads.append(common.loadavg())
        row = {m: {"median_s": common.median(ts), "min_s": min(ts), "max_s": max(ts),
                   "steps_per_s": 1024 / common.median(ts)} for m, ts in times.items()}
        row["bf16_speedup"] = common.ratio(row["float32"]["median_s"], row["bf16"]["median_s"])
        row["bf16_rel_update_diff"] = rel
        row["loadavg"] = loads
        results["games"][game] = row
        common.print_table(f"PPO update of 1024 samples, 4 epochs x 4 minibatches ({game}, {a.threads} threads)",
                           ["mode", "median s", "min", "max", "steps/s (compute limit)"],
                           [[m, common.fmt(row[m]["median_s"], 3), common.fmt(row[m]["min_s"], 3),
                             common.fmt(row[m]["max_s"], 3), common.fmt(row[m]["steps_per_s"])]
                            for m in ("float32", "bf16")])
        print(f"bf16 speed-up {row['bf16_speedup']:.2f}x; one update's weight change differs by {rel:.3f} "
              f"(relative L2) from float32's; load {loads[-1]}")
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
