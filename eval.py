"""Evaluate a checkpoint under one or several modification strings; one row per modification.

    python eval.py --agent_path runs/<run>/<exp_name>.cleanrl_model --modifs "" "all_green_cars"

`--agent_path` takes the final policy (`runs/<run>/<exp_name>.cleanrl_model`, a plain state_dict: the run's
config.json next to it describes the agent), a full checkpoint (`runs/<run>/checkpoints/*.cleanrl_model`) or a run
directory (its newest checkpoint). The architecture, observation settings and environment come from the run;
`--env_id` / `--backend` only change them when given, `--her` / `--game_specific_goals` are checked against it.
Default: the unmodified game (or the `--modifs` given); `--all_regimes` evaluates every regime of the curriculum.
Episodes are whole games (no life cuts, no step cap, whatever `--max_episode_steps` the agent was trained with, as the
seed's eval.py); `--eval_max_episode_steps N` caps them, and every row says the cap and how many games it cut short.
Writes CSV and JSON next to the run.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
import time
from typing import Optional, Sequence

import torch

from agents import agent_module
from continual import console
from continual.config.loading import args_from_dict, cli
from continual.errors import exit_on_user_error
from continual.evaluation import checkpoints
from continual.evaluation.checkpoints import (  # noqa: F401  (eval.X, as before the machinery moved)
    FREE_SPACE,
    EvalArgs,
    check_training_flags,
    evaluate_checkpoint,
    print_table,
    regimes_to_evaluate,
)
from continual.io import atomic_open, atomic_write_csv, atomic_write_json, storage_errors
from continual.training.checkpoint import load_policy_file
from continual.training.tracking import check_writable


def load_policy(state: dict, obs_space, action_space, device: torch.device):
    return checkpoints.load_policy(state, obs_space, action_space, device, agent_module)


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(EvalArgs, argv, default=None, description=__doc__.splitlines()[0])
    args.given_flags = tuple(name for name in ("her", "game_specific_goals") if flag_given(argv, name))
    return matrix(args) if len(args.agent_path) > 1 else evaluate_checkpoint(args, agent_module)


def flag_given(argv: Sequence[str], name: str) -> bool:
    spellings = {name, name.replace("_", "-")}
    return any(a.split("=", 1)[0] in {f"--{p}{n}" for n in spellings for p in ("", "no-", "no_")} for a in argv)


def matrix(args: EvalArgs) -> list[dict]:
    """Matrix mode: every checkpoint under every modification (the --modifs given or the unmodified game;
    --all_regimes: the union of their curricula's regimes too).

    Writes <output>.csv / .json (one row per checkpoint x modification), <output>_matrix.csv (rows checkpoints,
    columns modifications, mean returns) and <output>_matrix.png (heatmap); each checkpoint's own table goes to
    <output>__<label>.csv/.json.
    """
    states = [load_policy_file(p) for p in args.agent_path]
    for st in states:
        check_training_flags(args, args_from_dict(st["args"]), st["path"])
    modifs = regimes_to_evaluate(args, states)
    first_run = states[0]["run_dir"]
    output = args.output or os.path.join(first_run, "eval", f"matrix__{int(time.time())}")
    check_writable(os.path.dirname(os.path.abspath(output)) or ".")
    labels: list[str] = []
    for st in states:
        run = os.path.basename(st["run_dir"])
        label = f"{run}/{os.path.basename(st['path']).replace('.cleanrl_model', '')}"
        labels.append(label if label not in labels else f"{label} ({len(labels)})")
    rows: list[dict] = []
    for label, st in zip(labels, states):
        print(f"\n{label}")
        sub = dataclasses.replace(args, agent_path=[st["path"]], modifs=modifs, all_regimes=False, track=False,
                                  output=f"{output}__{label.replace('/', '__').replace(' ', '_')}")
        torch.manual_seed(args.seed)  # the same action-sampling stream for every checkpoint
        rows += [{"checkpoint": label, "global_step": st["global_step"], **r} for r in evaluate_checkpoint(sub, agent_module)]
    means = {(r["checkpoint"], r["modification"]): r["mean"] for r in rows}
    grid = [[means.get((lab, m), float("nan")) for m in modifs] for lab in labels]
    with storage_errors(output + ".csv", hint=FREE_SPACE):
        with atomic_open(output + "_matrix.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["checkpoint", "global_step", *[m or "(none)" for m in modifs]])
            writer.writerows([lab, st["global_step"], *g] for lab, st, g in zip(labels, states, grid))
        atomic_write_csv(output + ".csv", list(dict.fromkeys(k for r in rows for k in r)), rows)
        atomic_write_json(output + ".json", {"checkpoints": labels, "modifications": modifs, "mean": grid,
                                             "greedy": args.greedy, "seed": args.seed,
                                             "eval_episodes": args.eval_episodes,
                                             "max_episode_steps": args.eval_max_episode_steps, "results": rows})
    import numpy as np

    from continual.evaluation.plots import heatmap, regime_label

    png = heatmap(np.array(grid, dtype=float), labels, [regime_label(m) for m in modifs], output + "_matrix.png",
                  f"Mean return over {args.eval_episodes} games ({'greedy' if args.greedy else 'sampled'} actions)",
                  "modification", "checkpoint", "mean return")
    console.print_table("evaluation matrix (mean return)", ["checkpoint", *(m or "(none)" for m in modifs)],
                        [[lab, *(f"{v:.2f}" for v in g)] for lab, g in zip(labels, grid)])
    print(f"wrote {output}.csv, {output}.json, {output}_matrix.csv and {png}")
    if args.track:
        import wandb

        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, dir=args.wandb_dir or first_run,
                         id=args.wandb_run_id, resume="must" if args.wandb_run_id else None, job_type="eval",
                         config=None if args.wandb_run_id else {"checkpoints": labels, "modifications": modifs})
        run.log({"eval/matrix": wandb.Table(columns=["checkpoint", *modifs], data=[[lab, *g] for lab, g in
                                                                                 zip(labels, grid)]),
                 "eval/matrix_heatmap": wandb.Image(png)})
        run.finish()
    return rows


if __name__ == "__main__":
    main()
