"""Benchmark: the compute limit of PPO's update, float32 against --bf16 (bfloat16 autocast of the forward pass).

The update alone: 4 epochs over a stored rollout (`--games`: CleanRL's 4 x 4 minibatches of 8 envs x 128 steps on
Freeway frames or MinAtar grids; `minatar_purejaxrl`: PureJaxRL's MinAtar settings, 8 minibatches of 64 envs x 128
with separate 64-64 MLPs), with the network and loss of `agents.ppo` (the clipped surrogate, clipped value loss and
entropy, gradient clipping, foreach Adam). Its steps/s (rollout size / update seconds) is what a PPO run could reach if acting and env stepping were
free: the run's steps/s over this number is its share of the compute limit.

Same process, the modes (precision x torch thread count x the convolutions' memory layout) alternate round-robin (the order rotates every repeat);
medians with min/max. With both precisions, also checks that one bf16 update lands close to the float32 one from
the same weights (relative weight-change difference).

Run from the repository root:  python bench/update_limit.py [--repeats 5] [--json bench/results/update_limit.json]
    python bench/update_limit.py --games minatar_purejaxrl --precisions float32 --threads 1,2 --repeats 5
    python bench/update_limit.py --games minatar --precisions float32 --threads 1 --layouts channels_last,contiguous
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

# workload: observation shape, actions, network, rollout size, minibatches, clip coefficient
WORKLOADS = {
    "freeway": ((4, 84, 84), 18, "default", 1024, 4, 0.1),  # PPO's Atari defaults, 8 envs x 128
    "minatar": ((7, 10, 10), 6, "default", 1024, 4, 0.1),  # the same on MinAtar's grid with its small CNN
    # PureJaxRL's MinAtar settings (configs/minatar_ppo.json): Breakout's 4 channels, 64 envs x 128, 8 minibatches,
    # separate 64-64 actor and critic MLPs
    "minatar_purejaxrl": ((4, 10, 10), 3, "mlp", 8192, 8, 0.2),
}


LAYOUTS = ("agent", "channels_last", "contiguous")


def rollout(obs_shape, n_actions, n: int, gen: torch.Generator):
    obs = torch.randint(0, 256, (n,) + obs_shape, dtype=torch.uint8, generator=gen) if obs_shape[1] > 36 \
        else torch.randint(0, 2, (n,) + obs_shape, generator=gen).to(torch.uint8)
    return dict(obs=obs, actions=torch.randint(0, n_actions, (n,), generator=gen),
                logprobs=torch.full((n,), -float(np.log(n_actions))), advantages=torch.randn(n, generator=gen),
                returns=torch.randn(n, generator=gen), values=torch.randn(n, generator=gen))


def update(agent: Agent, opt, b: dict, bf16: bool, epochs: int = 4, minibatches: int = 4, seed: int = 0,
           clip: float = 0.1) -> None:
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
            pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            v = v.view(-1)
            vc = b["values"][i] + (v - b["values"][i]).clamp(-clip, clip)
            vl = 0.5 * torch.max((v - b["returns"][i]) ** 2, (vc - b["returns"][i]) ** 2).mean()
            loss = pg - 0.01 * ent.mean() + 0.5 * vl
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--games", default="freeway,minatar", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--threads", default=str(torch.get_num_threads()),
                   help="torch intra-op thread counts, comma-separated: each is a mode of the round-robin")
    p.add_argument("--precisions", default="float32,bf16", help="float32 and/or bf16 (comma-separated)")
    p.add_argument("--layouts", default="agent",
                   help="the convolutions' memory layout, comma-separated: agent (the network's own choice), "
                        "channels_last, contiguous")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    precisions = a.precisions.split(",")
    layouts = a.layouts.split(",")
    games = a.games.split(",")
    if any(g not in WORKLOADS for g in games) or any(x not in ("float32", "bf16") for x in precisions) or \
            any(t < 1 for t in threads) or any(x not in LAYOUTS for x in layouts):
        p.error(f"--games of {', '.join(WORKLOADS)}; --precisions float32/bf16; --threads >= 1; --layouts of "
                f"{', '.join(LAYOUTS)}")
    modes = [f"{x}/{t}t/{lay}" for x in precisions for t in threads for lay in layouts]
    results = {"machine": common.machine_info(), "threads": threads, "games": {}}
    for game in games:
        obs_shape, n_actions, network, n, minibatches, clip = WORKLOADS[game]
        b = rollout(obs_shape, n_actions, n, torch.Generator().manual_seed(0))
        scale = 1 / 255 if obs_shape[1] > 36 else 1.0

        def make(layout: str = "agent") -> Agent:
            agent = Agent(obs_shape, n_actions, obs_scale=scale, network=network)
            if layout != "agent":  # weights and input in the layout asked for, whatever the agent's own choice
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                agent.to(memory_format=fmt)
                agent.scaled_input = lambda x: x.to(dtype=torch.float32, memory_format=fmt, copy=True) * scale
            return agent

        torch.manual_seed(0)
        base = make()
        moved = {}
        if "bf16" in precisions and "float32" in precisions:  # closeness: one update from the same weights each
            for bf16 in (False, True):
                agent = make()
                agent.load_state_dict(base.state_dict())
                update(agent, torch.optim.Adam(agent.parameters(), 2.5e-4, eps=1e-5), b, bf16,
                       minibatches=minibatches, clip=clip)
                moved[bf16] = torch.cat([(p1 - p0).detach().flatten()
                                         for p1, p0 in zip(agent.parameters(), base.parameters())])
        rel = float((moved[True] - moved[False]).norm() / moved[False].norm()) if moved else None
        times: dict[str, list[float]] = {m: [] for m in modes}
        loads = []
        for r in range(a.repeats):
            for mode in common.rotation(modes, r):
                precision, t, layout = mode.split("/")
                torch.set_num_threads(int(t[:-1]))
                agent = make(layout)
                opt = torch.optim.Adam(agent.parameters(), 2.5e-4, eps=1e-5, foreach=True)
                update(agent, opt, b, precision == "bf16", epochs=1, minibatches=minibatches, clip=clip)  # warm-up
                start = time.perf_counter()
                update(agent, opt, b, precision == "bf16", minibatches=minibatches, seed=r, clip=clip)
                times[mode].append(time.perf_counter() - start)
            loads.append(common.loadavg())
        row = {m: {"median_s": common.median(ts), "min_s": min(ts), "max_s": max(ts),
                   "steps_per_s": n / common.median(ts)} for m, ts in times.items()}
        row["bf16_rel_update_diff"] = rel
        row["loadavg"] = loads
        results["games"][game] = row
        common.print_table(f"PPO update of {n} samples, 4 epochs x {minibatches} minibatches ({game})",
                           ["mode", "median s", "min", "max", "steps/s (compute limit)"],
                           [[m, common.fmt(row[m]["median_s"], 3), common.fmt(row[m]["min_s"], 3),
                             common.fmt(row[m]["max_s"], 3), common.fmt(row[m]["steps_per_s"])] for m in modes])
        if rel is not None:
            print(f"one bf16 update's weight change differs by {rel:.3f} (relative L2) from float32's")
        print(f"load {loads[-1]}")
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
