"""Micro-benchmark of PPO's device-side pieces (no envs): one acting step and one minibatch update of the Nature CNN
(agents.ppo.Agent) on whatever device torch finds, under variants of the settings that matter on a GPU.

- act: forward + sample + the action's copy to the host (`action.cpu()`, as the rollout does), batch = num_envs;
  plus the host->device copy of one step's uint8 observations (pageable vs pinned);
- learn: one minibatch of PPO's loss + backward + clip + Adam step (batch = num_envs * 128 / 4), with the host
  syncs the training loop adds per minibatch (3 loss checks, 6 gradient norms, 1 clip fraction) or without them.
Variants: distribution argument validation on/off (torch.distributions' default validates, which syncs with the
device twice per Categorical), cudnn.benchmark on/off, channels-last weights or not, TF32 matmuls.

Run from the repository root:  python bench/gpu_micro.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401  (puts the repository root on sys.path)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from agents.ppo import Agent  # noqa: E402
from continual.plasticity.diagnostics import PlasticityMonitor  # noqa: E402
from continual.training.guards import check_losses  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, device, reps: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t) / reps * 1e3


def make(device, channels_last: bool) -> tuple[Agent, torch.optim.Optimizer]:
    torch.manual_seed(0)
    agent = Agent((4, 84, 84), 3, obs_scale=1 / 255)
    if not channels_last:
        agent = agent.to(memory_format=torch.contiguous_format)
    agent = agent.to(device)
    return agent, torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)


def learn_step(agent, opt, obs, actions, old_logp, adv, ret, old_v, host_syncs: bool, monitor=None) -> None:
    _, logp, ent, v = agent.get_action_and_value(obs, actions)
    logratio = logp - old_logp
    ratio = logratio.exp()
    with torch.no_grad():
        clipfrac = ((ratio - 1.0).abs() > 0.1).float().mean()
        if host_syncs:
            clipfrac.item()
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = torch.max(-a * ratio, -a * torch.clamp(ratio, 0.9, 1.1)).mean()
    v = v.view(-1)
    vc = old_v + torch.clamp(v - old_v, -0.1, 0.1)
    vl = 0.5 * torch.max((v - ret) ** 2, (vc - ret) ** 2).mean()
    loss = pg - 0.01 * ent.mean() + 0.5 * vl
    if monitor is not None:  # the training loop's own checks (whichever checkout is on PYTHONPATH)
        check_losses(0, value_loss=vl, policy_loss=pg, entropy=ent.mean())
    elif host_syncs:  # what continual.testing.faults.check_losses did before it synced once
        for x in (vl, pg, ent.mean()):
            float(x.detach())
    opt.zero_grad()
    loss.backward()
    if monitor is not None:
        monitor.record_grads()
    elif host_syncs:  # what continual.plasticity.diagnostics.PlasticityMonitor.record_grads did before it kept norms on the device
        {n: float(m.weight.grad.norm()) for n, m in agent.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
    opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", type=int, default=[8, 64])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--real-checks", action="store_true",
                   help="only the default variant, with the real check_losses + record_grads of the checkout on "
                        "PYTHONPATH (A/B of the sync fixes: run once per checkout)")
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    variants = {
        "default (validate, channels-last, no cudnn.benchmark, syncs)": dict(validate=True, cl=True, bench=False,
                                                                              syncs=True, tf32=False),
        "no distribution validation": dict(validate=False, cl=True, bench=False, syncs=True, tf32=False),
        "no validation, no per-minibatch host syncs": dict(validate=False, cl=True, bench=False, syncs=False,
                                                           tf32=False),
        "no validation, cudnn.benchmark": dict(validate=False, cl=True, bench=True, syncs=True, tf32=False),
        "no validation, contiguous (not channels-last)": dict(validate=False, cl=False, bench=False, syncs=True,
                                                              tf32=False),
        "no validation, TF32 matmuls": dict(validate=False, cl=True, bench=False, syncs=True, tf32=True),
    }
    if args.real_checks:
        variants = {"real check_losses + record_grads": dict(validate=True, cl=True, bench=False, syncs=True,
                                                             tf32=False, real=True)}
    out = {"device": name, "results": {}}
    rng = np.random.default_rng(0)
    for n in args.envs:
        obs_np = rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8)
        pinned = torch.from_numpy(obs_np).pin_memory() if device.type == "cuda" else torch.from_numpy(obs_np)
        h2d = {"pageable_ms": timeit(lambda: torch.as_tensor(obs_np, device=device), device, args.reps),
               "pinned_ms": timeit(lambda: pinned.to(device, non_blocking=True), device, args.reps)}
        mb = n * 128 // 4
        bobs = torch.as_tensor(rng.integers(0, 256, (mb, 4, 84, 84), dtype=np.uint8), device=device)
        res = {"h2d_obs": h2d}
        for label, v in variants.items():
            torch.distributions.Distribution.set_default_validate_args(v["validate"])
            torch.backends.cudnn.benchmark = v["bench"]
            torch.backends.cuda.matmul.allow_tf32 = v["tf32"]
            agent, opt = make(device, v["cl"])
            x = torch.as_tensor(obs_np, device=device)

            def act():
                with torch.no_grad():
                    a, _, _, _ = agent.get_action_and_value(x)
                a.cpu()

            with torch.no_grad():
                acts, old_logp, _, old_v = agent.get_action_and_value(bobs)
            adv, ret = torch.randn(mb, device=device), torch.randn(mb, device=device)
            monitor = None
            if v.get("real"):
                session = types.SimpleNamespace(args=types.SimpleNamespace(diagnostics_every=0), global_step=0,
                                                before_switch=[])
                monitor = PlasticityMonitor(session, agent)
            act_ms = timeit(act, device, args.reps)
            learn_ms = timeit(lambda: learn_step(agent, opt, bobs, acts, old_logp, adv, ret, old_v.view(-1),
                                                 v["syncs"], monitor), device, max(10, args.reps // 10))
            res[label] = {"act_ms": act_ms, "learn_minibatch_ms": learn_ms}
            print(f"{name} envs {n:3d} minibatch {mb:5d} | {label:<48} act {act_ms:7.3f} ms  learn {learn_ms:8.2f} ms",
                  flush=True)
        print(f"{name} envs {n:3d} obs host->device: pageable {h2d['pageable_ms']:.3f} ms, pinned "
              f"{h2d['pinned_ms']:.3f} ms", flush=True)
        out["results"][str(n)] = res
    torch.distributions.Distribution.set_default_validate_args(True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
