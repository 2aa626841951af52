"""Evaluate a checkpoint under modification strings (the machinery of `eval.py` and `continual.api.evaluate`): one
row per modification, written as CSV and JSON next to the run. eval.py's matrix mode (several checkpoints) calls it
per checkpoint.

The agents' networks come through `agent_module(architecture)` (the module with `make_agent`, None when the
architecture is not available), given by the entry point: continual/ never imports agents/.
"""

from __future__ import annotations

import dataclasses
import os
import time
from types import ModuleType
from typing import Annotated, Callable, Optional, Sequence

import gymnasium as gym
import torch
import tyro
from tqdm import tqdm

from continual import console
from continual.config.loading import args_from_dict
from continual.envs.backends import task_compat, validate_env_id, validate_task
from continual.envs.vector import EnvSettings, make_vector_env, regime_slug
from continual.errors import UserError
from continual.evaluation.continual import single_torch_thread
from continual.evaluation.episodes import EvalResult, agent_policy, constant_policy, evaluate, random_policy
from continual.io import atomic_write_csv, atomic_write_json, storage_errors
from continual.modstrings import normalize_modification, parse_task, parse_tasks, task_env_ids
from continual.plasticity.injection import restore_injection
from continual.training.checkpoint import load_policy_file
from continual.training.tracking import check_writable

FREE_SPACE = "free space and run eval.py again"  # a full disk writing the results (exit 1, one line)

AgentLookup = Callable[[str], Optional[ModuleType]]


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
    """games per modification (whole games unless --eval_max_episode_steps)"""
    eval_max_episode_steps: Annotated[Optional[int], tyro.conf.arg(aliases=("--max_episode_steps",))] = None
    """cap every game at this many agent steps (a capped game counts as one; rows say how many were cut); unset:
    whole games, whatever --max_episode_steps the agent was trained with"""
    num_envs: Optional[int] = None
    """parallel envs; unset: min(eval_episodes, 4)"""
    greedy: bool = False
    """take the most likely action instead of sampling"""
    constant_action: Optional[int] = None
    """play this action every step instead of the agent's (a reflex baseline, e.g. Freeway's UP = 1), under the
    run's own env settings; the network is loaded and checked but does not act"""
    random_actions: bool = False
    """play uniformly random actions instead of the agent's (the no-agent baseline of a game; drawn from a torch
    generator seeded with --seed), under the run's own env settings; the network is loaded and checked but does not
    act"""
    action_shares: bool = False
    """also record the share of each action taken in the evaluated games (a discrete action space; column
    action_share): a policy that drifted off an action shows here, e.g. Freeway's UP"""
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


def load_policy(state: dict, obs_space, action_space, device: torch.device, agent_module: AgentLookup,
                env: Optional[tuple[str, str]] = None):
    """The checkpoint's policy network for these spaces; `env`: (env_id, backend) being evaluated, named with the
    trained one when the weights do not fit."""
    train_args = args_from_dict(state["args"])
    module = agent_module(state["architecture"])
    agent = module.make_agent(obs_space, action_space, train_args).to(device)
    try:
        restore_injection(agent, state["model"])  # --plasticity_injection: rebuild the injected heads first
        agent.load_state_dict(state["model"])
    except RuntimeError as e:
        trained = f"{train_args.env_id} ({train_args.backend})"
        here = f"{env[0]} ({env[1]})" if env is not None else "this environment"
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        # torch's first line is "Error(s) in loading state_dict for Agent:"; the first mismatch says more
        why = lines[1] if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else type(e).__name__)
        if env is not None and (env[0], env[1]) != (train_args.env_id, train_args.backend):
            raise UserError(f"checkpoint weights do not fit: the {state['architecture']} agent was trained on {trained}"
                            f", evaluated on {here}, whose observations or actions differ ({why}); evaluate on "
                            f"{train_args.env_id} (drop --env_id/--backend) or a game with the same spaces") from None
        raise UserError(f"checkpoint weights do not fit a {state['architecture']} agent for {here}, trained on "
                        f"{trained} ({why})") from None
    agent.eval()
    return agent


def print_table(rows: list[dict]) -> None:
    her = [k for k in ("success_rate", "goal_distance") if k in rows[0]]  # HER agents
    shares = ["action_share"] if "action_share" in rows[0] else []
    console.print_table("evaluation", ["modification", "episodes", "mean", "std", "min", "max", "mean_length", *her,
                                       *shares],
                        [[r["modification"] or "(none)", r["episodes"],
                          *(f"{r[k]:.2f}" for k in ("mean", "std", "min", "max")), f"{r['mean_length']:.1f}",
                          *(f"{r[k]:.2f}" for k in her),
                          *(" ".join(f"{x:.3f}" for x in r[k]) for k in shares)] for r in rows])
    print(cap_line(rows))


def cap_line(rows: list[dict]) -> str:
    """What the games were: whole, or capped (at what, and how many the cap cut short)."""
    cap = rows[0].get("max_episode_steps") if rows else None
    if cap is None:
        return "games: whole games (no step cap; --eval_max_episode_steps N caps them)"
    cut, total = sum(r.get("capped", 0) for r in rows), sum(r["episodes"] for r in rows)
    return f"games: capped at {cap} agent steps (--eval_max_episode_steps); {cut} of {total} games cut short by the cap"


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
    return list(dict.fromkeys(normalize_modification(m) for m in modifs))


def evaluate_checkpoint(args: EvalArgs, agent_module: AgentLookup) -> list[dict]:
    """One checkpoint (args.agent_path[0]): a row per modification, printed and written as CSV/JSON."""
    if args.eval_episodes <= 0:
        raise UserError(f"eval_episodes: must be positive, got {args.eval_episodes}")
    if args.num_envs is not None and args.num_envs <= 0:
        raise UserError(f"num_envs: must be positive, got {args.num_envs}")
    if args.eval_max_episode_steps is not None and args.eval_max_episode_steps <= 0:
        raise UserError(f"eval_max_episode_steps: must be positive, got {args.eval_max_episode_steps}")
    if args.random_actions and args.constant_action is not None:
        raise UserError("random_actions: not with --constant_action (one policy plays instead of the agent)")
    if args.random_actions and args.greedy:
        raise UserError("random_actions: not with --greedy (the actions are drawn uniformly, not from the agent)")
    state = load_policy_file(args.agent_path[0])
    if agent_module(state["architecture"]) is None:
        raise UserError(f"checkpoint architecture {state['architecture']!r} is not supported by this version")
    train_args = args_from_dict(state["args"])
    check_training_flags(args, train_args, state["path"])
    env_id = args.env_id or train_args.env_id
    backend = args.backend or train_args.backend
    validate_env_id(backend, env_id)
    modifs = regimes_to_evaluate(args, [state])
    tasks = []
    for m in modifs:
        tasks.append(parse_task(m, backend, env_id))
        validate_task(tasks[-1])
    # a task sequence across games: the spaces the agent was trained with must hold every game asked for
    trained_games = task_env_ids(parse_tasks(state.get("regimes") or [train_args.modifs], backend, env_id))
    asked_games = task_env_ids(tasks)
    compat = task_compat(backend, tuple(sorted({*trained_games, *asked_games})), train_args.obs_mode)
    if len(trained_games) > 1 and compat != task_compat(backend, trained_games, train_args.obs_mode):
        new = sorted(set(asked_games) - set(trained_games))
        raise UserError(f"modifs: {', '.join(new)} does not fit the observation/action spaces of the games the agent "
                        f"was trained on ({', '.join(trained_games)})")

    run_dir = state["run_dir"]
    stem = os.path.basename(state["path"]).replace(".cleanrl_model", "")
    if args.constant_action is not None:
        stem += f"__constant_action{args.constant_action}"
    if args.random_actions:
        stem += "__random_actions"
    output = args.output or os.path.join(run_dir, "eval", f"{stem}__{int(time.time())}")
    check_writable(os.path.dirname(os.path.abspath(output)) or ".")

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    num_envs = args.num_envs or min(args.eval_episodes, 4)
    settings = EnvSettings.from_args(
        train_args, video_dir=output + "__videos" if args.capture_video else None,
        env_id=env_id, backend=backend, episodic_life=False,
        # whole games unless a cap is asked for (the seed's eval.py): the training run's cap does not apply
        max_episode_steps=args.eval_max_episode_steps,
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
        agent = load_policy(state, envs.single_observation_space, envs.single_action_space, device, agent_module,
                            env=(env_id, backend))
        space = envs.single_action_space
        if args.constant_action is not None and not (isinstance(space, gym.spaces.Discrete)
                                                     and 0 <= args.constant_action < space.n):
            raise UserError(f"constant_action: {args.constant_action} is no action of {env_id} ({space})")
        if args.action_shares and not isinstance(space, gym.spaces.Discrete):
            raise UserError(f"action_shares: {env_id}'s actions are not discrete ({space})")
        if args.random_actions and not isinstance(space, gym.spaces.Discrete):
            raise UserError(f"random_actions: {env_id}'s actions are not discrete ({space})")
        print(f"evaluating {len(modifs)} modification{'s' * (len(modifs) != 1)} x {args.eval_episodes} games"
              + ("" if args.constant_action is None else f" with the constant action {args.constant_action}, not "
                 "the agent's")
              + (" with uniformly random actions, not the agent's" if args.random_actions else "")
              + ("" if args.all_regimes or len(modifs) > 1 else " (--all_regimes: every regime of the curriculum)"))
        bar = tqdm(total=len(modifs) * args.eval_episodes, unit="game", disable=not args.progress_bar,
                   dynamic_ncols=True, mininterval=1.0)  # the ETA is the estimate of the time left
        act = (constant_policy(args.constant_action) if args.constant_action is not None
               else random_policy(space.n, args.seed) if args.random_actions
               else agent_policy(agent, greedy=args.greedy))
        # a few observations a step: one torch thread (a whole Freeway game took 26 s instead of 191 s on a loaded
        # 2-core machine); the caller's thread count is restored (the Python API's notebook)
        with single_torch_thread():
            for m in modifs:
                bar.set_postfix_str(f"modification={m or '(none)'}", refresh=False)
                if m != envs.modification:
                    envs.switch(m)
                # HER checkpoints play goal-conditioned with their goal setup; the row adds the success rate
                result: EvalResult = evaluate(act, envs, args.eval_episodes, device, seed=args.seed,
                                              on_episode=lambda: bar.update(1), count_actions=args.action_shares)
                rows.append(result.row())
    finally:
        if bar is not None:
            bar.close()
        envs.close()

    print_table(rows)
    meta = {"checkpoint": state["path"], "architecture": state["architecture"], "global_step": state["global_step"],
            "env_id": env_id, "backend": backend, "greedy": args.greedy, "seed": args.seed,
            "max_episode_steps": args.eval_max_episode_steps}
    if args.constant_action is not None:  # the agent did not act: say so where the greedy flag would mislead
        meta["constant_action"] = args.constant_action
    if args.random_actions:
        meta["random_actions"] = True
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
