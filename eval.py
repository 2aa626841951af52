"""Evaluate a checkpoint under one or several modification strings; one row per modification.

    python eval.py --agent_path runs/<run>/<exp_name>.cleanrl_model --modifs "" "all_green_cars"

`--agent_path` takes the final policy (`runs/<run>/<exp_name>.cleanrl_model`, a plain state_dict: the run's
config.json next to it describes the agent), a full checkpoint (`runs/<run>/checkpoints/*.cleanrl_model`) or a run
directory (its newest checkpoint). The architecture, observation settings and environment come from the run;
`--env_id` / `--backend` only change them when given, `--her` / `--game_specific_goals` are checked against it.
Default: the unmodified game (or the `--modifs` given); `--all_regimes` evaluates every regime of the curriculum.
Episodes are whole games (no life cuts). Writes CSV and JSON next to the run.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import os
import sys
import time
from typing import Optional, Sequence

import torch
import tyro
from tqdm import tqdm

from agents import AGENT_MODULES
from continual import console
from continual.config.loading import args_from_dict, cli
from continual.envs.backends import task_compat, task_env_ids, validate_env_id, validate_modification
from continual.envs.vector import EnvSettings, make_vector_env, regime_slug
from continual.errors import UserError, exit_on_user_error
from continual.evaluation.episodes import EvalResult, agent_policy, evaluate
from continual.io import atomic_open, atomic_write_csv, atomic_write_json, storage_errors
from continual.training.checkpoint import load_policy_file
from continual.training.tracking import check_writable

FREE_SPACE = "free space and run eval.py again"  # a full disk writing the results (exit 1, one line)


@dataclasses.dataclass
class EvalArgs:
    agent_path: list[str]
    """final policy (runs/<run>/<exp_name>.cleanrl_model), checkpoint (runs/<run>/checkpoints/*.cleanrl_model) or
    run directory (its newest checkpoint); several: matrix mode, one table with a row per checkpoint and a column
    per modification, plus a heatmap PNG"""
    modifs: Optional[list[str]] = None
    """modification strings to evaluate, one row each (quote each string); unset: the unmodified game"""
    all_regimes: bool = False
    """evaluate every regime of the training curriculum (plus the --modifs given): the regime matrix"""
    env_id: Optional[str] = None
    """environment id; unset: the one the agent was trained on"""
    backend: Optional[str] = None
    """HackAtari | OCAtari | Gymnasium | MinAtar; unset: the one the agent was trained on"""
    her: bool = False
    """the agent was trained with --her (checked against the run; HER agents are evaluated goal-conditioned either
    way)"""
    game_specific_goals: bool = False
    """the agent was trained with --game_specific_goals (checked against the run)"""
    eval_episodes: int = 10
    """whole games per modification"""
    num_envs: Optional[int] = None
    """parallel envs; unset: min(eval_episodes, 4)"""
    greedy: bool = False
    """take the most likely action instead of sampling"""
    seed: int = 1
    """seed of the evaluation envs (env i gets seed+i)"""
    capture_video: bool = False
    """record the first game of each modification (videos/ next to the output)"""
    output: Optional[str] = None
    """output path without extension; unset: <run dir>/eval/<checkpoint>__<time>"""
    progress_bar: bool = True
    """show a progress bar over all games (with a time estimate) on stderr"""
    cuda: bool = True
    """use CUDA when available"""
    track: bool = False
    """log the results to Weights & Biases"""
    wandb_project_name: str = "continual_hackatari"
    """W&B project"""
    wandb_entity: Optional[str] = None
    """W&B entity"""
    wandb_dir: Optional[str] = None
    """W&B local folder"""
    wandb_run_id: Optional[str] = None
    """attach the results to this existing W&B run instead of creating an evaluation run"""
    given_flags: tyro.conf.Suppress[tuple[str, ...]] = ()
    """set by main(): which of --her / --game_specific_goals were typed, so that only those are checked"""


def load_policy(state: dict, obs_space, action_space, device: torch.device):
    train_args = args_from_dict(state["args"])
    module = importlib.import_module(AGENT_MODULES[state["architecture"]])
    agent = module.make_agent(obs_space, action_space, train_args).to(device)
    try:
        agent.load_state_dict(state["model"])
    except RuntimeError as e:
        raise UserError(f"checkpoint weights do not fit a {state['architecture']} agent for this environment "
                        f"({str(e).splitlines()[0]})") from None
    agent.eval()
    return agent


def print_table(rows: list[dict]) -> None:
    her = [k for k in ("success_rate", "goal_distance") if k in rows[0]]  # HER agents
    console.print_table("evaluation", ["modification", "episodes", "mean", "std", "min", "max", *her],
                        [[r["modification"] or "(none)", r["episodes"],
                          *(f"{r[k]:.2f}" for k in ("mean", "std", "min", "max", *her))] for r in rows])


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(EvalArgs, argv, default=None, description=__doc__.splitlines()[0])
    args.given_flags = tuple(name for name in ("her", "game_specific_goals") if flag_given(argv, name))
    return matrix(args) if len(args.agent_path) > 1 else evaluate_checkpoint(args)


def flag_given(argv: Sequence[str], name: str) -> bool:
    spellings = {name, name.replace("_", "-")}
    return any(a.split("=", 1)[0] in {f"--{p}{n}" for n in spellings for p in ("", "no-", "no_")} for a in argv)


def check_training_flags(args: EvalArgs, train_args, path: str) -> None:
    """--her / --game_specific_goals, when given, must say how the agent was trained (the seed asks users to pass
    them; the network itself comes from the run)."""
    for name in args.given_flags:
        given, trained = getattr(args, name), getattr(train_args, name)
        if given != trained:
            raise UserError(f"{name}: --{name} {given} does not match the agent, trained with {name}={trained} "
                            f"({path})")


def regimes_to_evaluate(args: EvalArgs, states: Sequence[dict]) -> list[str]:
    """The --modifs given, or the unmodified game; --all_regimes adds every regime of the curricula."""
    modifs = list(args.modifs) if args.modifs is not None else ([] if args.all_regimes else [""])
    if args.all_regimes:
        for st in states:
            modifs += list(st.get("regimes") or [args_from_dict(st["args"]).modifs])
    return list(dict.fromkeys(" ".join(sorted(set(m.split()))) for m in modifs))


def evaluate_checkpoint(args: EvalArgs) -> list[dict]:
    """One checkpoint (args.agent_path[0]): a row per modification, printed and written as CSV/JSON."""
    if args.eval_episodes <= 0:
        raise UserError(f"eval_episodes: must be positive, got {args.eval_episodes}")
    if args.num_envs is not None and args.num_envs <= 0:
        raise UserError(f"num_envs: must be positive, got {args.num_envs}")
    state = load_policy_file(args.agent_path[0])
    if state["architecture"] not in AGENT_MODULES:
        raise UserError(f"checkpoint architecture {state['architecture']!r} is not supported by this version")
    train_args = args_from_dict(state["args"])
    check_training_flags(args, train_args, state["path"])
    env_id = args.env_id or train_args.env_id
    backend = args.backend or train_args.backend
    validate_env_id(backend, env_id)
    modifs = regimes_to_evaluate(args, [state])
    for m in modifs:
        validate_modification(backend, env_id, m)
    # a task sequence across games: the spaces the agent was trained with must hold every game asked for
    trained_games = task_env_ids(env_id, state.get("regimes") or [train_args.modifs])
    compat = task_compat(backend, tuple(sorted({*trained_games, *task_env_ids(env_id, modifs)})), train_args.obs_mode)
    if len(trained_games) > 1 and compat != task_compat(backend, trained_games, train_args.obs_mode):
        new = sorted(set(task_env_ids(env_id, modifs)) - set(trained_games))
        raise UserError(f"modifs: {', '.join(new)} does not fit the observation/action spaces of the games the agent "
                        f"was trained on ({', '.join(trained_games)})")

    run_dir = state["run_dir"]
    stem = os.path.basename(state["path"]).replace(".cleanrl_model", "")
    output = args.output or os.path.join(run_dir, "eval", f"{stem}__{int(time.time())}")
    check_writable(os.path.dirname(os.path.abspath(output)) or ".")

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    num_envs = args.num_envs or min(args.eval_episodes, 4)
    settings = EnvSettings.from_args(
        train_args, video_dir=output + "__videos" if args.capture_video else None,
        env_id=env_id, backend=backend, episodic_life=False,
        # a task sequence across games: the spaces the agent was trained with (and those of any game asked for)
        compat=compat, curriculum=state.get("regimes") or [train_args.modifs],
    )
    if args.capture_video:
        settings = dataclasses.replace(settings, video_dir=output + "__videos", video_every=10**9)

    rows: list[dict] = []
    envs = make_vector_env(settings, num_envs, modifs[0])
    bar = None
    try:
        # weights that do not fit this env are bad input: one line, before anything is printed
        agent = load_policy(state, envs.single_observation_space, envs.single_action_space, device)
        print(f"evaluating {len(modifs)} modification{'s' * (len(modifs) != 1)} x {args.eval_episodes} games"
              + ("" if args.all_regimes or len(modifs) > 1 else " (--all_regimes: every regime of the curriculum)"))
        bar = tqdm(total=len(modifs) * args.eval_episodes, unit="game", disable=not args.progress_bar,
                   dynamic_ncols=True, mininterval=1.0)  # the ETA is the estimate of the time left
        act = agent_policy(agent, greedy=args.greedy)
        for m in modifs:
            bar.set_postfix_str(f"modification={m or '(none)'}", refresh=False)
            if m != envs.modification:
                envs.switch(m)
            # HER checkpoints play goal-conditioned with their goal setup; the row adds the success rate
            result: EvalResult = evaluate(act, envs, args.eval_episodes, device, seed=args.seed,
                                          on_episode=lambda: bar.update(1))
            rows.append(result.row())
    finally:
        if bar is not None:
            bar.close()
        envs.close()

    print_table(rows)
    meta = {"checkpoint": state["path"], "architecture": state["architecture"], "global_step": state["global_step"],
            "env_id": env_id, "backend": backend, "greedy": args.greedy, "seed": args.seed}
    if train_args.her:  # HER: the goal setup the agent was evaluated with (from the checkpoint)
        meta["her"] = {"game_specific_goals": train_args.game_specific_goals, "tolerance": train_args.her_tolerance}
    with storage_errors(output + ".csv", hint=FREE_SPACE):
        atomic_write_csv(output + ".csv", list(rows[0]), rows)
        atomic_write_json(output + ".json", {**meta, "results": rows})
    print(f"wrote {output}.csv and {output}.json")

    if args.track:
        import wandb

        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, dir=args.wandb_dir or run_dir,
                         id=args.wandb_run_id, resume="must" if args.wandb_run_id else None, job_type="eval",
                         group=os.path.basename(run_dir), config=None if args.wandb_run_id else meta)
        table = wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
        run.log({"eval/table": table, **{f"eval/{regime_slug(r['modification'])}": r["mean"] for r in rows}})
        run.finish()
    return rows


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
        rows += [{"checkpoint": label, "global_step": st["global_step"], **r} for r in evaluate_checkpoint(sub)]
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
                                             "eval_episodes": args.eval_episodes, "results": rows})
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
