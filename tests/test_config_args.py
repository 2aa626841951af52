"""--help is grouped by flag group, keeps the flat flag names in the underscore form the docs write (dashed forms
parse too), and never prints a default twice."""

from __future__ import annotations

import dataclasses
import re

import pytest

from conftest import run_script
from continual.config.args import Args, grouped_class
from continual.config.loading import parse_args

PANELS = ["run", "environment", "PPO", "network", "tracking", "CBP", "plasticity", "methods", "EWC", "IMPALA", "CLEAR", "PNC", "DQN", "HER",
          "evaluation"]


def help_text(script: str) -> str:
    return run_script(script, "--help", env={"COLUMNS": "120"}).stdout


def panels(text: str) -> dict[str, str]:
    found = re.findall(r"╭─ (\S+) options ─+╮\n(.*?)╰", text, re.S)
    return {name: body for name, body in found}


def test_training_help_is_grouped_with_flat_flags():
    found = panels(help_text("continual_training_example.py"))
    assert [p for p in found if p != "options"] == PANELS
    where = {flag: name for name, body in found.items() for flag in re.findall(r"│ (--[a-z0-9_]+)", body)}
    assert where["--learning_rate"] == "PPO" and where["--replacement_rate"] == "CBP" and where["--her"] == "HER"
    assert where["--track"] == "tracking" and where["--capture_video"] == "tracking"
    assert where["--eval_every"] == "evaluation" and where["--num_actors"] == "IMPALA" and where["--seed"] == "run"
    assert where["--ewc_lambda"] == "EWC" and where["--clear_buffer_frames"] == "CLEAR" and where["--redo"] == "methods"
    assert {f.name for f in dataclasses.fields(Args)} == {f[2:] for f in where}


def test_help_writes_flags_as_the_docs_do():
    """`--help | grep -- --eval_every` finds the flag; a switch's negation is --no_<name>; no dashed form is shown."""
    text = help_text("continual_training_example.py")
    assert "--eval_every INT" in text and "--track, --no_track" in text and "--total_timesteps" in text
    assert not re.search(r"--[a-z0-9]+-[a-z0-9-]+", text), re.findall(r"--[a-z0-9]+-[a-z0-9-]+", text)[:5]
    assert "--eval_max_episode_steps" in help_text("eval.py")


def test_dashed_and_underscore_spellings_both_parse():
    """The seed's users type dashed flags (--total-timesteps, --no-progress-bar); the docs write underscores."""
    a, _ = parse_args(["--total-timesteps", "64", "--no-progress-bar", "--eval-every", "32", "--no-anneal_lr"])
    b, _ = parse_args(["--total_timesteps", "64", "--no_progress_bar", "--eval_every", "32", "--no-anneal-lr"])
    assert a == b and (a.total_timesteps, a.progress_bar, a.eval_every, a.anneal_lr) == (64, False, 32, False)


def test_no_default_printed_twice():
    for script in ("continual_training_example.py", "eval.py"):
        text = help_text(script)
        # one flag's help may wrap over several lines: join them per flag
        entries = re.split(r"│ --", text)
        for entry in entries[1:]:
            flat = " ".join(ln.strip(" │") for ln in entry.splitlines())
            assert len(re.findall(r"\(default|default:", flat.split("╰")[0])) <= 1, flat


def test_flat_flag_names_still_parse_in_every_group():
    args, _ = parse_args(["--learning_rate", "0.1", "--replacement-rate", "0.2", "--her", "--eval_every", "5",
                          "--num_actors", "3", "--env_id", "continual/GoalGrid-v0", "--backend", "Gymnasium", "--track"])
    assert (args.learning_rate, args.replacement_rate, args.her, args.eval_every, args.num_actors) == (0.1, 0.2, True,
                                                                                                      5, 3)
    assert args.env_id == "continual/GoalGrid-v0" and args.track and isinstance(args, Args)
    assert parse_args([])[0] == Args()


def test_grouped_class_holds_every_field_once():
    names = [f.name for g in dataclasses.fields(grouped_class()) for f in dataclasses.fields(g.type.__origin__)]
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(Args))


def test_gradient_clipping_default_follows_the_loss_scale():
    """IMPALA's family sums its losses over the batch (gradient norms ~50-160 on MinAtar): its default clip is
    TorchBeast's 40; PPO/A2C average theirs: 0.5. An explicit --max_grad_norm wins for every architecture."""
    from continual.config.args import Args

    assert {a: Args(architecture=a).grad_clip_norm() for a in ("PPO", "PPO_CBP", "A2C", "IMPALA", "CLEAR", "PNC")} \
        == {"PPO": 0.5, "PPO_CBP": 0.5, "A2C": 0.5, "IMPALA": 40.0, "CLEAR": 40.0, "PNC": 40.0}
    assert Args(architecture="IMPALA", max_grad_norm=0.5).grad_clip_norm() == 0.5


@pytest.mark.parametrize("argv,expected", [
    (["--architecture", "IMPALA"], 40.0), (["--architecture", "PPO"], 0.5), (["--architecture", "CLEAR"], 40.0),
    (["--architecture", "IMPALA", "--max_grad_norm", "2"], 2.0)])
def test_the_effective_gradient_clip_is_what_a_run_records(argv, expected):
    """config.json, the printed configuration and checkpoints are args_to_dict(args): they hold the number in force,
    not None ("the architecture's default")."""
    from continual.config.loading import args_to_dict
    from continual.training.startup import parse_train_args

    args, _, _ = parse_train_args(["--backend", "Gymnasium", "--env_id", "CartPole-v1", *argv])
    assert args.max_grad_norm == expected and args_to_dict(args)["max_grad_norm"] == expected
