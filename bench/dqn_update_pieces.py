"""Benchmark: the per-update pieces of agents/dqn.py around the network's kernels (Continual MinAtar's DQN, padded to
10 channels, batch 32, fused Adam), each against a bit-exact cheaper form: what agents/dqn_seeds.py's one-seed path
skips and what else could be cut without changing a float.

CPU microseconds per call (`time.process_time` loops, the pieces round-robin, median and quartiles over `--rounds`):
- a forward through QNetwork's modules against the same kernels called directly (dqn_seeds.seed_forward), batch 1
  (acting) and 32 (three forwards an update, five with C-CHAIN);
- the plasticity monitor's gradient norms (every update; only the iteration's last are logged);
- C-CHAIN's reference copy (a copy_ per parameter) against one torch._foreach_copy_;
- optimizer.zero_grad() against grad = None per parameter;
- Optimizer.step() (fused Adam) against the fused kernel called directly (bit-equality checked, and that the step
  leaves the gradients as they were);
- the hooks of the extensions that do nothing in these runs (PlasticityMethods without a method, RegimeStart).

    python bench/dqn_update_pieces.py --rounds 15
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.optim as optim  # noqa: E402

from agents.dqn import CONTINUAL, RegimeStart, make_agent  # noqa: E402
from agents.dqn_seeds import seed_forward  # noqa: E402
from continual.config.args import default_args  # noqa: E402
from continual.plasticity.c_chain import CChain  # noqa: E402
from continual.plasticity.diagnostics import PlasticityMonitor  # noqa: E402
from continual.plasticity.methods import PlasticityMethods  # noqa: E402


def timed(fn, n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=400, help="calls per piece and round")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    common.print_machine(common.machine_info())
    run_args = default_args("DQN")
    space, actions = gym.spaces.Box(0, 1, (10, 10, 10), np.float32), gym.spaces.Discrete(6)
    q = make_agent(space, actions, run_args)
    opt = optim.Adam(q.parameters(), lr=3e-4, fused=True)
    session = types.SimpleNamespace(args=run_args, global_step=0, np_rng=np.random.default_rng(1))
    monitor = PlasticityMonitor(session, q)
    chain = CChain(q, CONTINUAL.c_chain.schedule, CONTINUAL.c_chain)
    idle = [PlasticityMethods(session, q, opt, lambda: make_agent(space, actions, run_args)),
            RegimeStart(run_args, None)]
    x32 = (torch.rand(32, 10, 10, 10) > 0.9).float()
    x1 = x32[:1]
    kernels, named = seed_forward(q), dict(q.named_parameters())
    params, ref = list(q.parameters()), list(chain.ref.parameters())
    q(x32).pow(2).mean().backward()
    opt.step()  # Adam's state exists
    grads = [t.grad for t in params]
    group = opt.param_groups[0]
    state = [opt.state[t] for t in params]

    def fused_direct() -> None:  # what Optimizer.step reaches for fused Adam without its Python around the kernel
        steps = [s["step"] for s in state]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(params, [t.grad for t in params], [s["exp_avg"] for s in state],
                           [s["exp_avg_sq"] for s in state], [], steps, amsgrad=False, lr=group["lr"],
                           beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=group["weight_decay"],
                           eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)

    # the direct call is Optimizer.step bit for bit: the same start, one step each
    saved = [t.detach().clone() for t in params], [{k: v.clone() for k, v in s.items()} for s in state]
    before = [t.grad.clone() for t in params]
    opt.step()
    # what reading the monitor's norms after the step instead of before it needs
    unchanged = all(torch.equal(a, t.grad) for a, t in zip(before, params))
    print(f"Optimizer.step leaves the gradients as they were: {unchanged}")
    stepped = [t.detach().clone() for t in params]
    with torch.no_grad():
        for t, v in zip(params, saved[0]):
            t.copy_(v)
        for s, v in zip(state, saved[1]):
            for k in s:
                s[k].copy_(v[k])
    fused_direct()
    print(f"fused kernel called directly == Optimizer.step: {all(torch.equal(a, b) for a, b in zip(stepped, params))}")

    def no_grad(fn):
        def call():
            with torch.no_grad():
                fn()
        return call

    def regrad() -> None:
        for t, g in zip(params, grads):
            t.grad = g

    def set_none() -> None:
        for t in params:
            t.grad = None
        regrad()

    def foreach_copy() -> None:
        with torch.no_grad():
            torch._foreach_copy_(ref, params)

    def idle_hooks() -> None:
        for e in idle:
            e.loss(None, q, {})
            e.before_step()
            e.after_step(opt)
            e.after_update({"obs": x1})

    pieces = {
        "forward, modules, batch 1": no_grad(lambda: q(x1)),
        "forward, kernels, batch 1": no_grad(lambda: kernels(named, x1)),
        "forward, modules, batch 32": no_grad(lambda: q(x32)),
        "forward, kernels, batch 32": no_grad(lambda: kernels(named, x32)),
        "monitor gradient norms": monitor.record_grads,
        "C-CHAIN reference copy (CChain.before_step)": chain.before_step,
        "C-CHAIN reference copy, _foreach_copy_": foreach_copy,
        "optimizer.zero_grad() (+ grads back)": lambda: (opt.zero_grad(), regrad()),
        "grad = None per parameter (+ grads back)": set_none,
        "Optimizer.step(), fused Adam": opt.step,
        "fused Adam kernel called directly": fused_direct,
        "hooks of PlasticityMethods (none on) + RegimeStart": idle_hooks,
    }
    times: dict[str, list[float]] = {k: [] for k in pieces}
    for r in range(args.rounds):
        for name in common.rotation(list(pieces), r):
            times[name].append(timed(pieces[name], args.calls))
    rows = []
    for name, ts in times.items():
        ts = sorted(ts)
        quartiles = common.fmt(ts[len(ts) // 4]), common.fmt(ts[3 * len(ts) // 4])
        rows.append([name, common.fmt(common.median(ts)), *quartiles])
    common.print_table(f"CPU us per call ({args.rounds} rounds of {args.calls}; load now {common.loadavg()})",
                       ["piece", "median", "q1", "q3"], rows)


if __name__ == "__main__":
    main()
