"""Diagnostic (run once, then removed from bench/): where PPO's time goes by py-spy samples, per part of the loop.

Records a PPO training run under py-spy (raw format) and splits the samples inside `agents/ppo.py`'s `train` by the
line of `train` they are under (the update's forward and backward, the act step's torsos and categorical, the env
step, the minibatch gather, Adam, clipping, the monitor's gradient norms, the rollout's bookkeeping). Samples under
the optimizer's construction (torch._dynamo's import, start-up) are left out.

    python bench/pyspy_split.py --py-spy /path/to/py-spy -- --config configs/minatar_ppo_gymnax.json --total_timesteps 491520
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def line_of(source: list[str], text: str, start: int) -> int:
    return next(start + i for i, line in enumerate(source[start - 1:]) if text in line) if text else -1


def split(raw: str) -> tuple[int, collections.Counter]:
    sys.path.insert(0, ROOT)
    from agents import ppo

    source, first = inspect.getsourcelines(ppo.train)
    lines = {name: line_of(source, text, 1) + first - 1 for name, text in {
        "update backward": "total.backward()", "update forward+loss": "update_loss(",
        "act": "act_step(next_obs", "env step": "envs.step(", "minibatch gather": "ext.minibatch(",
        "grad clip": "clip_grad_norm_", "adam step": "optimizer.step()", "monitor grad norms": "ext.before_step()",
    }.items()}
    rollout = (line_of(source, "for step in range(args.num_steps)", 1) + first - 1,
               line_of(source, "rollout_time = time.time()", 1) + first - 1)
    by_line = {v: k for k, v in lines.items()}
    total, shares = 0, collections.Counter()
    for row in open(raw):
        stack, n = row.rstrip().rsplit(" ", 1)
        frames = stack.split(";")
        in_train = [f for f in frames if f.startswith("train (") and "agents/ppo.py" in f]
        if not in_train or any("make_optimizer" in f for f in frames):
            continue
        total += int(n)
        line = int(in_train[-1].rsplit(":", 1)[1].rstrip(")"))
        part = by_line.get(line) or ("rollout bookkeeping" if rollout[0] < line < rollout[1] else "other")
        if part == "act":
            part = "act: " + next((k for k in ("torsos", "categorical") if any(k in f for f in frames)), "rest")
        shares[part] += int(n)
    return total, shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="after --: the training run's flags")
    args = parser.parse_args()
    flags = [f for f in args.flags if f != "--"]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.txt")
        subprocess.run([args.py_spy, "record", "-r", str(args.rate), "-f", "raw", "-o", raw, "--", sys.executable,
                        os.path.join(ROOT, "continual_training_example.py"), *flags, "--checkpoint_every", "0",
                        "--runs_dir", tmp, "--exp_name", "pyspy"], check=True, cwd=ROOT)
        total, shares = split(raw)
    print(f"{total} samples in train (start-up's optimizer construction left out)")
    for part, n in shares.most_common():
        print(f"{n:6d} {100 * n / total:5.1f}%  {part}")


if __name__ == "__main__":
    main()
