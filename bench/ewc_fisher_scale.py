"""EWC's two Fisher scales on a trained network: CORA's (`--ewc_fisher cora`) against the per-sample true Fisher
(`--ewc_fisher true`), both estimated at the same parameters on the same stored data.

    python bench/ewc_fisher_scale.py bench/out/forgetting_ewc/IMPALA_EWC__s*/checkpoints/final__step200000.cleanrl_model

Each CHECKPOINT is a full IMPALA checkpoint of a run with `--ewc ... --ewc_fisher cora` (bench/forgetting.py's EWC
rows): it holds the network and EWC's buffer, the last `--ewc_samples` steps of the regime being trained as whole
unrolls. On them: F_cora = 1/M sum_m (grad of the summed V-trace pg + vf_coef * value loss over a batch)^2 (CORA's
counts from the run's flags: 400 samples = 20 unrolls of 20, M = 100), F_true = 1/N sum_n (grad log pi(a_n|s_n))^2
with a_n drawn from the policy on each of the buffer's N observations. Printed per parameter tensor: the ratio of the
means, mean(F_cora) / mean(F_true) (the factor by which a `true` lambda must exceed a `cora` one for the same
penalty on that tensor), and the median of the elementwise ratios; the value head has F_true = 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401  (puts the repository root on sys.path)

from agents import impala, ppo  # noqa: E402
from continual.config.loading import args_from_dict  # noqa: E402
from continual.plasticity.ewc import batch_fisher, diagonal_fisher  # noqa: E402
from continual.training.checkpoint import load_checkpoint  # noqa: E402


def fisher_ratios(path: str, seed: int = 0) -> dict:
    state = load_checkpoint(path, expect_architecture="IMPALA")
    args = args_from_dict(state["args"])
    ewc = state["ewc"]
    if ewc is None or ewc.get("fisher") != "cora" or not ewc["filled"]:
        raise SystemExit(f"error: {path} holds no --ewc_fisher cora buffer")
    agent = ppo.Agent(state["obs_shape"], state["n_actions"], obs_scale=state["obs_scale"])
    agent.load_state_dict(state["model"])
    rows = {k: v[:ewc["filled"]] for k, v in ewc["buffer"].items()}
    T = args.unroll_length
    t0 = time.process_time()
    cora = batch_fisher(agent, impala.ewc_batch_loss(args), rows, max(1, round(args.ewc_fisher_batch / T)),
                        args.ewc_fisher_batches, torch.Generator().manual_seed(seed))
    t_cora = time.process_time() - t0
    obs = rows["obs"][:, :T].reshape(-1, *state["obs_shape"])
    t0 = time.process_time()
    true = diagonal_fisher(agent, ppo.policy_head, obs, False, torch.Generator().manual_seed(seed))
    t_true = time.process_time() - t0
    tensors = {}
    for n in cora:
        c, t = cora[n].double(), true[n].double()
        pos = t > 0
        tensors[n] = {
            "mean_cora": c.mean().item(), "mean_true": t.mean().item(),
            "ratio_of_means": (c.mean() / t.mean()).item() if t.mean() > 0 else None,
            "median_elementwise_ratio": (c[pos] / t[pos]).median().item() if pos.any() else None,
        }
    return {"checkpoint": path, "step": state["global_step"], "regime": state["modification"],
            "rows": ewc["filled"], "unroll_length": T, "observations": len(obs),
            "cora_batch_samples": max(1, round(args.ewc_fisher_batch / T)) * T, "cora_batches": args.ewc_fisher_batches,
            "cpu_s": {"cora": t_cora, "true": t_true}, "tensors": tensors}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    missing = [c for c in a.checkpoints if not os.path.isfile(c)]
    if missing:
        print(f"error: no such checkpoint: {missing[0]}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)
    out = []
    for path in a.checkpoints:
        r = fisher_ratios(path)
        out.append(r)
        print(f"{path}: step {r['step']}, {r['regime']}, {r['observations']} observations "
              f"(CPU s: cora {r['cpu_s']['cora']:.1f}, true {r['cpu_s']['true']:.1f})")
        for n, d in r["tensors"].items():
            ratio = "inf (F_true = 0)" if d["ratio_of_means"] is None else f"{d['ratio_of_means']:.3g}"
            med = "-" if d["median_elementwise_ratio"] is None else f"{d['median_elementwise_ratio']:.3g}"
            print(f"  {n:20s} mean F_cora {d['mean_cora']:.3g}  mean F_true {d['mean_true']:.3g}  "
                  f"ratio of means {ratio}  median elementwise {med}")
    finite = [d["ratio_of_means"] for r in out for d in r["tensors"].values() if d["ratio_of_means"] is not None]
    print(f"ratio of means over the policy and torso tensors of {len(out)} networks: min {min(finite):.3g}, "
          f"median {float(np.median(finite)):.3g}, max {max(finite):.3g}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": common.machine_info(), "results": out}, f, indent=1)
    return out


if __name__ == "__main__":
    main()
