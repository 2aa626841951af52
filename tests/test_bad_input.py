"""Malformed input never gives a traceback.

Every case must exit with code 2, print exactly one non-empty stderr line starting with "error:" that names the
offending field or token (and at most 3 lines in all, stdout included: nothing is printed before the input is
validated), print no "Traceback", and leave the runs directory (and any run directory or evaluation
output it points at) exactly as it was.

Most cases call the script's `main(argv)` in this process, through `run_main` in tests/conftest.py (stdout and
stderr captured; a warning counts as a line, an uncaught exception as a traceback), which spares each a second
import of torch. The cases in SUBPROCESS run the real scripts as subprocesses: one of each script (the training example,
agents/ppo.py, eval.py) and of each kind of input (a config file, a flag, a checkpoint), for what only a process
shows: output at import time and the exit status a shell sees. A tiny real CartPole training run makes one valid
checkpoint per module for the --resume and eval.py cases. A case that depends on something this machine cannot
provide (a read-only directory when running as root) is skipped with the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import glob
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from conftest import run_main

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAIN = "continual_training_example.py"
EVAL = "eval.py"
CASE_TIMEOUT_S = 60  # a subprocess case

# --------------------------------------------------------------------------------------------------------------------
# case model
# --------------------------------------------------------------------------------------------------------------------


class Skip(Exception):
    """Raised by a case builder when this machine cannot produce the situation (the test is then skipped)."""


@dataclasses.dataclass
class Ctx:
    """What a case builder gets: its own folder, the runs dir, and (waiting for it) the shared checkpoint."""

    case_dir: Path
    runs_dir: Path
    _checkpoint: Callable[[], Path]
    watch: list[Path] = dataclasses.field(default_factory=list)  # folders that must not change

    @property
    def checkpoint(self) -> Path:
        return self._checkpoint()

    def file(self, name: str, content: str | bytes) -> str:
        path = self.case_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return str(path)

    def config(self, data: Any, name: str = "run_config.json") -> str:
        return self.file(name, data if isinstance(data, (str, bytes)) else json.dumps(data))

    def run_copy(self) -> Path:
        """A private copy of the checkpoint's run directory; returns the copied checkpoint path (watched)."""
        src = self.checkpoint.parent.parent
        dst = self.case_dir / "run"
        shutil.copytree(src, dst)
        self.watch.append(dst)
        return dst / "checkpoints" / self.checkpoint.name

    def modified_checkpoint(self, edit: Callable[[dict], Any]) -> str:
        """Copy the run, load its checkpoint (weights_only), apply `edit` (returning a replacement or None), save."""
        import torch

        path = self.run_copy()
        state = torch.load(path, map_location="cpu", weights_only=True)
        new = edit(state)
        torch.save(state if new is None else new, path)
        return str(path)


@dataclasses.dataclass
class Case:
    id: str
    expect: tuple[str | tuple[str, ...], ...]  # substrings the error line must contain (a tuple: any one of them)
    build: Callable[[Ctx], list[str]]  # writes its files, returns the script's arguments
    script: str = TRAIN
    needs_checkpoint: bool = False
    runs_dir_flag: bool = True  # training runs get --runs_dir <case>/runs first
    files_only: bool = False  # eval.py may create its (empty) output folder before failing; no file may appear
    slow: bool = False  # set from CORE below


CASES: list[Case] = []


def case(id: str, expect: Any, build: Callable[[Ctx], list[str]], **kw: Any) -> None:
    assert all(c.id != id for c in CASES), f"duplicate case id {id}"
    CASES.append(Case(id, (expect,) if isinstance(expect, (str, AnyOf)) else tuple(expect), build, **kw))


class AnyOf(tuple):
    """An expectation met by any one of its substrings."""


# junk that is not a checkpoint at all: the message must say so (not "contains objects that are not plain weights")
NOT_A_CHECKPOINT = AnyOf(("corrupt", "not a checkpoint", "not a PyTorch", "not a continual-hackatari checkpoint"))


# --------------------------------------------------------------------------------------------------------------------
# valid starting points: each case breaks exactly one thing
# --------------------------------------------------------------------------------------------------------------------

CARTPOLE_FLAGS = ["--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2", "--num_steps", "32",
                  "--no-progress-bar"]

SEQ = {
    "num_total_steps": 4096,
    "modifications": ["", "gravity=15.0", "length=0.8"],
    "switching_thresholds": [1024, 2048],
}

CARTPOLE_CONFIG: dict[str, Any] = {
    "_comment": "valid CartPole curriculum; each bad-input case breaks one thing",
    "env_id": "CartPole-v1",
    "backend": "Gymnasium",
    "num_envs": 2,
    "num_steps": 32,
    "progress_bar": False,
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": SEQ,
}

FREEWAY_CONFIG: dict[str, Any] = {
    "env_id": "ALE/Freeway-v5",
    "backend": "HackAtari",
    "num_envs": 1,
    "num_steps": 32,
    "vector_env": "sync",
    "progress_bar": False,
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 128, "modifications": ["", "all_green_cars"],
                                    "switching_thresholds": [64]},
}

DELETE = object()


def with_changes(base: dict, changes: dict[str, Any]) -> dict:
    """Deep copy of `base` with dotted-path changes ("modification_factory_kwargs.epsilon"); DELETE removes."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = out
        for p in parents:
            node = node[p]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return out


def cartpole(id: str, expect: str | tuple[str, ...], changes: dict[str, Any], *flags: str) -> None:
    case(id, expect, lambda ctx: ["--config", ctx.config(with_changes(CARTPOLE_CONFIG, changes)), *flags])


def factory(id: str, expect: str | tuple[str, ...], name: str, kwargs: Any, base: dict = CARTPOLE_CONFIG) -> None:
    data = with_changes(base, {"modification_factory": name})
    data["modification_factory_kwargs"] = kwargs
    case(id, expect, lambda ctx: ["--config", ctx.config(data)])


def raw(id: str, expect: str | tuple[str, ...], text: str | bytes) -> None:
    case(id, expect, lambda ctx: ["--config", ctx.config(text)])


def flags(id: str, expect: str | tuple[str, ...], *argv: str, base: tuple[str, ...] = tuple(CARTPOLE_FLAGS)) -> None:
    case(id, expect, lambda ctx: [*base, *argv])


# --------------------------------------------------------------------------------------------------------------------
# the cases: config files
# --------------------------------------------------------------------------------------------------------------------

raw("json-invalid-syntax", "not valid JSON", '{"num_envs": 8,')
raw("json-trailing-comma", "not valid JSON", '{"num_envs": 8,}')
raw("json-single-quotes", "not valid JSON", "{'num_envs': 8}")
raw("json-comment-line", "not valid JSON", '{\n// comment\n"num_envs": 8}')
raw("json-top-level-array", ("top level", "list"), '[{"num_envs": 8}]')
raw("json-top-level-string", ("top level", "str"), '"num_envs"')
raw("json-top-level-number", ("top level", "int"), "42")
raw("json-top-level-null", "top level", "null")
raw("json-empty-file", "not valid JSON", "")
raw("json-whitespace-only", "not valid JSON", "  \n\t\n")
raw("json-not-utf8", "cannot be read", b'{"exp_name": "\xff\xfe"}')
raw("json-nan", "NaN", '{"learning_rate": NaN}')
raw("json-infinity", "Infinity", '{"gamma": Infinity}')
raw("json-minus-infinity", "-Infinity", '{"ent_coef": -Infinity}')
raw("json-nan-inside-factory-kwargs", "NaN",
    json.dumps(CARTPOLE_CONFIG).replace('"num_total_steps": 4096', '"num_total_steps": NaN'))
raw("json-1e400-float-field", "learning_rate", '{"learning_rate": 1e400}')
raw("json-1e400-int-field", "num_envs", '{"num_envs": 1e400}')
raw("json-1e400-num-total-steps", "num_total_steps",
    json.dumps(CARTPOLE_CONFIG).replace('"num_total_steps": 4096', '"num_total_steps": 1e400'))
raw("json-deeply-nested-lists", "nested too deeply", '{"_comment": ' + "[" * 100_000 + "]" * 100_000 + "}")
raw("json-deeply-nested-top", "nested too deeply", "[" * 100_000 + "]" * 100_000)
raw("json-deeply-nested-objects", "nested too deeply", '{"a":' * 100_000 + "1" + "}" * 100_000)
raw("json-file-too-large", "refusing", '{"_comment": "' + "x" * (5 * 1024 * 1024) + '"}')
case("config-is-a-directory", "is a directory", lambda ctx: ["--config", str(ctx.case_dir)])
case("config-missing-file", "does not exist", lambda ctx: ["--config", str(ctx.case_dir / "nope.json")])
case("config-equals-form-missing-file", "does not exist",
     lambda ctx: [f"--config={ctx.case_dir / 'nope.json'}"])
case("config-flag-without-path", "--config", lambda ctx: [*CARTPOLE_FLAGS, "--config"])

# wrong types
cartpole("type-int-as-string", "num_envs", {"num_envs": "8"})
cartpole("type-int-as-float", "num_envs", {"num_envs": 8.5})
cartpole("type-int-as-bool", "num_envs", {"num_envs": True})
cartpole("type-int-as-list", "num_envs", {"num_envs": [8]})
cartpole("type-int-as-null", "num_steps", {"num_steps": None})
cartpole("type-seed-fraction", "seed", {"seed": 1.5})
cartpole("type-float-as-string", "learning_rate", {"learning_rate": "0.001"})
cartpole("type-float-as-bool", "gamma", {"gamma": False})
cartpole("type-bool-as-string", ("track", "yes"), {"track": "yes"})
cartpole("type-bool-as-int", "anneal_lr", {"anneal_lr": 1})
cartpole("type-str-as-int", "exp_name", {"exp_name": 5})
cartpole("type-str-as-null", "env_id", {"env_id": None})
cartpole("type-literal-architecture", ("architecture", "SAC"), {"architecture": "SAC"})
cartpole("type-literal-backend", ("backend", "Gym"), {"backend": "Gym"})
cartpole("type-literal-case", ("reward_scaling", "Clip"), {"reward_scaling": "Clip"})
cartpole("type-optional-int-as-string", "total_timesteps", {"total_timesteps": "4096"})
cartpole("type-optional-float-as-list", "target_kl", {"target_kl": [0.1]})
cartpole("config-key-inside-config", "config", {"config": "other.json"})
cartpole("resume-key-inside-config", "resume", {"resume": "runs/x"})

# unknown keys
cartpole("unknown-key-typo", ("num_env", "did you mean 'num_envs'"), {"num_env": 4})
cartpole("unknown-key-typo-learning-rate", ("learningrate", "learning_rate"), {"learningrate": 0.1})
cartpole("unknown-key-typo-factory", ("modification_factory_kwarg", "did you mean"),
         {"modification_factory_kwarg": {}})
cartpole("unknown-key-unrelated", "banana", {"banana": 1})

# factories
cartpole("factory-unknown-name", "SequentialFactoryy", {"modification_factory": "SequentialFactoryy"})
cartpole("factory-name-not-a-string", "modification_factory", {"modification_factory": 5})
cartpole("factory-name-empty", "modification_factory", {"modification_factory": ""})
cartpole("factory-kwargs-list", "modification_factory_kwargs", {"modification_factory_kwargs": [1, 2]})
cartpole("factory-kwargs-string", "modification_factory_kwargs", {"modification_factory_kwargs": "x"})
cartpole("factory-kwargs-without-factory", "modification_factory", {"modification_factory": DELETE})
cartpole("factory-missing-thresholds", "switching_thresholds",
         {"modification_factory_kwargs.switching_thresholds": DELETE})
cartpole("factory-missing-num-total-steps", "num_total_steps",
         {"modification_factory_kwargs.num_total_steps": DELETE})
cartpole("factory-unknown-kwarg", "swtiching_thresholds", {"modification_factory_kwargs.swtiching_thresholds": [1]})
cartpole("factory-reserved-seed-kwarg", "seed", {"modification_factory_kwargs.seed": 3})
cartpole("thresholds-decreasing", ("switching_thresholds", "increasing"),
         {"modification_factory_kwargs.switching_thresholds": [2048, 1024]})
cartpole("thresholds-equal", ("switching_thresholds", "increasing"),
         {"modification_factory_kwargs.switching_thresholds": [1024, 1024]})
cartpole("thresholds-wrong-count", "switching_thresholds",
         {"modification_factory_kwargs.switching_thresholds": [1024]})
cartpole("thresholds-beyond-total", "switching_thresholds",
         {"modification_factory_kwargs.switching_thresholds": [1024, 9999]})
cartpole("thresholds-fraction", "switching_thresholds",
         {"modification_factory_kwargs.switching_thresholds": [1024.5, 2048]})
cartpole("num-total-steps-negative", "num_total_steps", {"modification_factory_kwargs.num_total_steps": -5})
cartpole("num-total-steps-zero", "num_total_steps", {"modification_factory_kwargs.num_total_steps": 0})
cartpole("num-total-steps-string", "num_total_steps", {"modification_factory_kwargs.num_total_steps": "4096"})
cartpole("modifications-empty-list", "modifications",
         {"modification_factory_kwargs.modifications": [], "modification_factory_kwargs.switching_thresholds": []})
cartpole("modifications-a-string", "modifications", {"modification_factory_kwargs.modifications": "gravity=12"})
cartpole("modifications-entry-not-string", "modifications", {"modification_factory_kwargs.modifications": ["", 1, ""]})
factory("probabilities-not-summing-to-1", "probabilities", "RandomModificationFactory",
        {"num_total_steps": 4096, "modifications": ["", "gravity=12"], "probabilities": [0.5, 0.2]})
factory("probabilities-negative", "probabilities", "RandomModificationFactory",
        {"num_total_steps": 4096, "modifications": ["", "gravity=12"], "probabilities": [1.5, -0.5]})
factory("probabilities-wrong-count", "probabilities", "RandomModificationFactory",
        {"num_total_steps": 4096, "modifications": ["", "gravity=12"], "probabilities": [1.0]})
factory("num-repetitions-zero", "num_repetitions", "RandomModificationFactory",
        {"num_total_steps": 4096, "modifications": ["", "gravity=12"], "num_repetitions": 0})
factory("epsilon-above-1", "epsilon", "EpsSequentialModificationFactory", {**SEQ, "epsilon": 1.5})
factory("epsilon-negative", "epsilon", "EpsSequentialModificationFactory", {**SEQ, "epsilon": -0.1})
factory("epsilon-string", "epsilon", "EpsSequentialModificationFactory", {**SEQ, "epsilon": "0.1"})
factory("all-combinations-empty-factor", "modifications", "AllCombinationsRandomModificationFactory",
        {"num_total_steps": 4096, "modifications": [["gravity=12"], []]})
factory("combined-no-phases", "modification_factory_kwargs", "CombinedModificationFactory",
        {"modification_factory_kwargs": {}})
factory("combined-unknown-nested-factory", "NoSuchFactory", "CombinedModificationFactory",
        {"modification_factory_kwargs": {"SequentialModificationFactory": SEQ, "NoSuchFactory": {}}})
factory("combined-nested-bad-kwarg", "num_total_step", "CombinedModificationFactory",
        {"modification_factory_kwargs": [{"modification_factory": "NoModification",
                                          "modification_factory_kwargs": {"num_total_step": 100}}]})

# modification names
factory("hackatari-unknown-modification", ("all_gren_cars", "all_green_cars"), "SequentialModificationFactory",
        {"num_total_steps": 128, "modifications": ["", "all_gren_cars"], "switching_thresholds": [64]},
        base=FREEWAY_CONFIG)
factory("hackatari-typo-in-nested-combined-phase", ("reverse_car_speed_tpo", "all_green_cars"),
        "EpsCombinedModificationFactory",
        {"epsilon": 0.1, "modification_factory_kwargs": {
            "SequentialModificationFactory": {"num_total_steps": 64, "modifications": ["", "disable_cars"],
                                              "switching_thresholds": [32]},
            "AllCombinationsRandomModificationFactory": {
                "num_total_steps": 64,
                "modifications": [["all_green_cars", "all_pink_cars"], ["", "reverse_car_speed_tpo"]]}}},
        base=FREEWAY_CONFIG)
flags("hackatari-unknown-cli-modifs", ("bogus_mod", "all_green_cars"),
      "--env_id", "ALE/Freeway-v5", "--num_envs", "1", "--num_steps", "32", "--total_timesteps", "64",
      "--modifs", "all_green_cars bogus_mod", "--no-progress-bar", base=())
flags("ocatari-with-modification", ("OCAtari", "all_green_cars"), "--env_id", "ALE/Freeway-v5", "--backend",
      "OCAtari", "--num_envs", "1", "--num_steps", "32", "--total_timesteps", "64", "--modifs", "all_green_cars",
      base=())
cartpole("gym-bad-value", "gravity=abc", {"modification_factory_kwargs.modifications": ["", "gravity=abc", "length=1"]})
cartpole("gym-unknown-parameter", "foo=1", {"modification_factory_kwargs.modifications": ["", "foo=1", "length=1"]})
flags("gym-cli-token-without-value", "gravity", "--total_timesteps", "128", "--modifs", "gravity")
flags("gym-cli-nan-value", "gravity=nan", "--total_timesteps", "128", "--modifs", "gravity=nan")
flags("gym-cli-parameter-twice", "gravity", "--total_timesteps", "128", "--modifs", "gravity=1 gravity=2")
flags("gym-cli-hackatari-name-on-cartpole", "all_green_cars", "--total_timesteps", "128",
      "--modifs", "all_green_cars")

# ranges
cartpole("range-num-envs-negative", "num_envs", {"num_envs": -1})
flags("range-num-envs-zero-cli", "num_envs", "--num_envs", "0")
flags("range-learning-rate-negative-cli", "learning_rate", "--learning_rate", "-0.001")
cartpole("range-learning-rate-zero", "learning_rate", {"learning_rate": 0})
cartpole("range-gamma-above-1", "gamma", {"gamma": 1.5})
flags("range-gae-lambda-negative", "gae_lambda", "--gae_lambda=-0.1")
cartpole("range-repeat-action-probability", "repeat_action_probability", {"repeat_action_probability": 2})
cartpole("range-clip-coef-zero", "clip_coef", {"clip_coef": 0})
cartpole("range-ent-coef-negative", "ent_coef", {"ent_coef": -1})
cartpole("range-noop-max-negative", "noop_max", {"noop_max": -1})
cartpole("range-checkpoint-every-negative", "checkpoint_every", {"checkpoint_every": -10})
cartpole("range-checkpoint-minutes-negative", "checkpoint_minutes", {"checkpoint_minutes": -5})
flags("range-checkpoint-minutes-nan", "checkpoint_minutes", "--checkpoint_minutes", "nan")
flags("save-agent-wandb-without-track", ("save_agent_wandb", "--track"), "--save_agent_wandb")
cartpole("range-num-minibatches-over-batch", "num_minibatches", {"num_minibatches": 128})
cartpole("range-target-kl-zero", "target_kl", {"target_kl": 0})
cartpole("range-max-episode-steps-zero", "max_episode_steps", {"max_episode_steps": 0})
flags("range-total-timesteps-zero", "total_timesteps", "--total_timesteps", "0")
flags("range-seed-negative", "seed", "--seed", "-1", "--total_timesteps", "128")
flags("range-run-name-with-slash", "run_name", "--run_name", "a/b")
flags("range-run-name-dotdot", "run_name", "--run_name", "..")
cartpole("total-timesteps-larger-than-curriculum", ("total_timesteps", "4097"), {}, "--total_timesteps", "4097")
# (--total_timesteps smaller than one rollout is not bad input: it is rounded up to whole rollouts with a note)
cartpole("ewc-on-an-agent-without-it", ("ewc", "DQN"), {}, "--architecture", "DQN", "--ewc", "ewc")
cartpole("bf16-on-an-agent-without-it", ("bf16", "IMPALA"), {}, "--architecture", "IMPALA", "--bf16")
cartpole("compile-on-an-agent-without-it", ("compile", "PPO_CBP"), {}, "--architecture", "PPO_CBP", "--compile")
cartpole("fused-adam-on-an-agent-without-it", ("fused_adam", "PPO_CBP"), {}, "--architecture", "PPO_CBP",
         "--fused_adam")
cartpole("act-threads-on-an-agent-without-them", ("act_threads", "DQN"), {}, "--architecture", "DQN",
         "--act_threads", "2")
flags("range-act-threads-negative", "act_threads", "--act_threads", "-1")
flags("cudagraphs-without-compile", ("cudagraphs", "--compile"), "--cudagraphs")
flags("cudagraphs-without-cuda", ("cudagraphs", "CUDA"), "--compile", "--cudagraphs", "--no-cuda")
flags("cudagraphs-with-her", ("cudagraphs", "--her"), "--compile", "--cudagraphs", "--her")
flags("cudagraphs-uneven-minibatches", ("cudagraphs", "num_minibatches=5"), "--compile", "--cudagraphs",
      "--num_minibatches", "5")
cartpole("redo-on-an-agent-without-it", ("redo", "PNC"), {}, "--architecture", "PNC", "--redo")
cartpole("trac-on-an-agent-without-it", ("trac", "IMPALA"), {}, "--architecture", "IMPALA", "--trac")
cartpole("trac-with-redo", ("trac", "redo"), {}, "--trac", "--redo")
cartpole("layer-norm-on-ppo-cbp", ("layer_norm", "PPO_CBP"), {}, "--architecture", "PPO_CBP", "--layer_norm")
cartpole("l2-and-l2-init-together", ("l2_init", "--l2"), {}, "--l2", "--l2_init")
cartpole("redo-with-crelu", ("redo", "crelu"), {}, "--redo", "--activation", "crelu")
cartpole("redo-tau-negative", "redo_tau", {}, "--redo", "--redo_tau", "-1")
cartpole("parseval-scale-zero", "parseval_scale", {}, "--parseval", "--parseval_scale", "0")
flags("redo-at-switches-without-switches", ("redo", "never switches"), "--redo", "--total_timesteps", "128")
cartpole("reset-every-without-reset-layers", ("reset_every", "reset_layers"), {}, "--reset_every", "100")
cartpole("nap-project-heads-without-nap", ("nap_project_heads", "--nap"), {}, "--nap_project_heads")
cartpole("trac-keep-base-without-trac", ("trac_keep_base", "--trac"), {}, "--trac_keep_base")
cartpole("injection-on-an-agent-without-it", ("plasticity_injection", "PNC"), {}, "--architecture", "PNC",
         "--plasticity_injection", "at_switches")
cartpole("injection-with-layer-resets", ("plasticity_injection", "reset_layers"), {}, "--plasticity_injection",
         "at_switches", "--reset_layers", "1")
flags("injection-at-switches-without-switches", ("plasticity_injection", "never switches"), "--plasticity_injection",
      "at_switches", "--total_timesteps", "128")

# environments
flags("env-bare-freeway-with-hackatari", ("env_id", "Freeway"), "--env_id", "Freeway", "--total_timesteps", "64",
      base=())
# an id of another backend with the default one (HackAtari) or a wrong one: the message names the likely --backend
flags("env-minatar-id-without-backend", ("env_id", "MinAtar/Breakout", "add --backend MinAtar"),
      "--env_id", "MinAtar/Breakout", "--total_timesteps", "64", base=())
flags("env-gym-id-without-backend", ("env_id", "CartPole-v1", "add --backend Gymnasium"),
      "--env_id", "CartPole-v1", "--total_timesteps", "64", base=())
flags("env-minatar-id-with-gymnasium", ("MinAtar/Breakout", "add --backend MinAtar"),
      "--env_id", "MinAtar/Breakout", "--backend", "Gymnasium", "--total_timesteps", "64", base=())
flags("env-unknown-ale-id", ("env_id", "NotAGame"), "--env_id", "ALE/NotAGame-v5", "--num_envs", "1",
      "--num_steps", "32", "--total_timesteps", "64", base=())
flags("env-unknown-gym-id", ("env_id", "NotAnEnv-v0"), "--env_id", "NotAnEnv-v0", "--backend", "Gymnasium",
      "--num_envs", "1", "--num_steps", "32", "--total_timesteps", "64", base=())

flags("env-box-actions-for-impala", ("Pendulum-v1", "Box", "IMPALA"), "--env_id", "Pendulum-v1", "--architecture",
      "IMPALA", "--total_timesteps", "640")
flags("flag-norm-obs-for-impala", ("norm_obs", "IMPALA"), "--architecture", "IMPALA", "--norm_obs")
flags("batched-for-gymnasium", ("vector_env", "MinAtar"), "--vector_env", "batched")
flags("batched-with-video", ("vector_env", "capture_video"), "--backend", "MinAtar", "--env_id", "MinAtar/Breakout",
      "--vector_env", "batched", "--capture_video")
flags("minatar-unknown-version", ("MinAtar/Breakout-v2", "-v1"), "--backend", "MinAtar", "--env_id",
      "MinAtar/Breakout-v2")
flags("minatar-permute-obs-not-an-integer", ("permute_obs=1.5", "integer"), "--backend", "MinAtar", "--env_id",
      "MinAtar/Breakout", "--modifs", "permute_obs=1.5")
flags("minatar-permute-actions-negative", ("permute_actions=-2", "integer"), "--backend", "MinAtar", "--env_id",
      "MinAtar/Breakout", "--modifs", "permute_actions=-2")
cartpole("removed-key-env-groups", ("env_groups", "removed"), {"env_groups": 2})
flags("mlp-for-dqn", ("network", "DQN"), "--architecture", "DQN", "--network", "mlp")
flags("mlp-hidden-size-zero", "hidden_size", "--network", "mlp", "--hidden_size", "0")
flags("mlp-with-layer-norm", ("network", "layer_norm"), "--network", "mlp", "--layer_norm")
flags("env-ori-observations-for-training", ("obs_mode", "ori"), "--env_id", "ALE/Freeway-v5", "--obs_mode", "ori",
      "--num_envs", "1", "--num_steps", "32", "--total_timesteps", "64", base=())

# command line
flags("cli-unknown-flag", "--num_env", "--num_env", "8")
flags("cli-int-not-a-number", ("num", "abc"), "--num_envs", "abc")
flags("cli-float-not-a-number", ("learning", "fast"), "--learning_rate", "fast")
flags("cli-bool-flag-with-value", "yes", "--track", "yes")
# the flag meant: a close name, and the switch's --no_ form for a value after a switch
flags("cli-misspelt-flag-suggests", ("--lerning_rate", "did you mean --learning_rate?"), "--lerning_rate", "1e-3")
flags("cli-switch-with-false-points-to-no", ("False", "--no_track"), "--track", "False")
flags("cli-literal-lists-choices", ("architecture", "SAC", "IMPALA", "DQN"), "--architecture", "SAC")


def _runs_dir_is_a_file(ctx: Ctx) -> list[str]:
    blocker = ctx.file("blocker", "a file, not a folder")
    return [*CARTPOLE_FLAGS, "--total_timesteps", "128", "--runs_dir", os.path.join(blocker, "runs")]


case("output-runs-dir-under-a-file", "not writable", _runs_dir_is_a_file, runs_dir_flag=False)
# permission bits pass /proc for root: the folder is probed by creating one, and that before the configuration printout
flags("output-runs-dir-unwritable-for-root", ("not writable", "/proc/forbidden"), "--total_timesteps", "128",
      "--runs_dir", "/proc/forbidden")
flags("output-wandb-dir-unwritable", ("not writable", "/proc/forbidden/wandb"), "--total_timesteps", "128",
      "--track", "--wandb_dir", "/proc/forbidden/wandb")


def _run_name_exists(ctx: Ctx) -> list[str]:
    (ctx.runs_dir / "taken").mkdir(parents=True)
    return [*CARTPOLE_FLAGS, "--total_timesteps", "128", "--run_name", "taken"]


case("output-run-name-exists", ("already exists", "taken"), _run_name_exists)

# --------------------------------------------------------------------------------------------------------------------
# --resume
# --------------------------------------------------------------------------------------------------------------------


def garbage(seed: int, n: int = 2048) -> bytes:
    """Deterministic junk (seeds 0, 2 and 20 hit three different failure paths of torch.load)."""
    return random.Random(seed).randbytes(n)


def _torch_file(ctx: Ctx, name: str, payload: Any) -> str:
    import torch

    path = ctx.case_dir / name
    torch.save(payload, path)
    return str(path)


def _truncated(ctx: Ctx) -> str:
    data = ctx.checkpoint.read_bytes()
    return ctx.file("truncated.cleanrl_model", data[: len(data) // 2])


def _empty_run_dir(ctx: Ctx) -> str:
    (ctx.case_dir / "emptyrun" / "checkpoints").mkdir(parents=True)
    return str(ctx.case_dir / "emptyrun")


def _format_99(state: dict) -> None:
    state["format_version"] = 99


def _args_list(state: dict) -> None:
    state["args"] = [1, 2, 3]


def _no_curriculum(state: dict) -> None:
    del state["curriculum"]


def _impala(state: dict) -> None:
    """The top-level field disagrees with the saved args (PPO) and the PPO weights."""
    state["architecture"] = "IMPALA"


def _no_such_architecture(state: dict) -> None:
    state["architecture"] = "NoSuchArch"


def _bad_saved_num_envs(state: dict) -> None:
    state["args"]["num_envs"] = "x"


def _unknown_saved_key(state: dict) -> None:
    state["args"]["not_a_field"] = 1


def resume(id: str, expect: str | tuple[str, ...], path: Callable[[Ctx], str], *extra: str,
           ckpt: bool = False, equals: bool = False) -> None:
    def build(ctx: Ctx) -> list[str]:
        p = path(ctx)
        return [f"--resume={p}"] if equals else ["--resume", p, *extra]

    case(id, expect, build, needs_checkpoint=ckpt, runs_dir_flag=False)


resume("resume-missing-file", "does not exist", lambda ctx: str(ctx.case_dir / "nope.cleanrl_model"))
resume("resume-equals-form-missing-file", "does not exist", lambda ctx: str(ctx.case_dir / "nope.cleanrl_model"),
       equals=True)
resume("resume-empty-file", "empty", lambda ctx: ctx.file("empty.cleanrl_model", b""))
resume("resume-garbage-bytes", NOT_A_CHECKPOINT, lambda ctx: ctx.file("garbage.cleanrl_model", garbage(2)))
resume("resume-zero-bytes", NOT_A_CHECKPOINT, lambda ctx: ctx.file("zeros.cleanrl_model", bytes(100)))
resume("resume-text-file", NOT_A_CHECKPOINT, lambda ctx: ctx.file("notes.cleanrl_model", "hello world\n"))
resume("resume-json-file", NOT_A_CHECKPOINT, lambda ctx: ctx.file("cfg.cleanrl_model", json.dumps(CARTPOLE_CONFIG)))
resume("resume-truncated-checkpoint", "truncated", _truncated, ckpt=True)
resume("resume-dict-without-keys", "missing keys", lambda ctx: _torch_file(ctx, "x.cleanrl_model", {"model": {}}))
resume("resume-list-payload", "not a continual-hackatari checkpoint",
       lambda ctx: _torch_file(ctx, "x.cleanrl_model", [1, 2, 3]))
resume("resume-pickled-object", "refused",
       lambda ctx: _torch_file(ctx, "x.cleanrl_model", {"when": datetime.datetime(2020, 1, 1)}))
resume("resume-run-dir-without-checkpoints", "no checkpoints", _empty_run_dir)
resume("resume-format-version", "format version", lambda ctx: ctx.modified_checkpoint(_format_99), ckpt=True)
resume("resume-changes-num-envs", ("cannot change", "num_envs"), lambda ctx: str(ctx.run_copy()), "--num_envs", "4",
       ckpt=True)
resume("resume-bad-flag-value", ("num", "abc"), lambda ctx: str(ctx.run_copy()), "--num_envs", "abc", ckpt=True)
resume("resume-saved-args-bad-type", "num_envs", lambda ctx: ctx.modified_checkpoint(_bad_saved_num_envs), ckpt=True)
resume("resume-saved-args-unknown-key", "not_a_field", lambda ctx: ctx.modified_checkpoint(_unknown_saved_key),
       ckpt=True)
resume("resume-saved-args-not-a-dict", "args", lambda ctx: ctx.modified_checkpoint(_args_list), ckpt=True)
resume("resume-missing-curriculum", "curriculum", lambda ctx: ctx.modified_checkpoint(_no_curriculum), ckpt=True)
resume("resume-architecture-field-mismatch", "architecture", lambda ctx: ctx.modified_checkpoint(_impala), ckpt=True)
resume("resume-architecture-unknown", ("architecture", "NoSuchArch"),
       lambda ctx: ctx.modified_checkpoint(_no_such_architecture), ckpt=True)


def _impala_run_dir(ctx: Ctx) -> list[str]:
    """A run directory whose checkpoint is IMPALA's through and through (field and saved args), resumed with the PPO
    agent file: it used to get past the checks and crash with KeyError 'reward_scaler'."""
    def whole_impala(state: dict) -> None:
        state["architecture"] = state["args"]["architecture"] = "IMPALA"

    return ["--resume", str(Path(ctx.modified_checkpoint(whole_impala)).parent.parent)]


case("resume-impala-run-with-the-ppo-file", ("IMPALA", "PPO"), _impala_run_dir, script="agents/ppo.py",
     needs_checkpoint=True, runs_dir_flag=False)

# --------------------------------------------------------------------------------------------------------------------
# eval.py
# --------------------------------------------------------------------------------------------------------------------


def evaluate(id: str, expect: str | tuple[str, ...], agent_path: Optional[Callable[[Ctx], str]], *extra: str,
             ckpt: bool = False, output: Optional[Callable[[Ctx], str]] = None) -> None:
    def build(ctx: Ctx) -> list[str]:
        argv = [] if agent_path is None else ["--agent_path", agent_path(ctx)]
        out = output(ctx) if output is not None else str(ctx.runs_dir / "eval" / "result")
        return [*argv, "--output", out, "--no-cuda", *extra]

    case(id, expect, build, script=EVAL, needs_checkpoint=ckpt, runs_dir_flag=False, files_only=True)


def _shared(ctx: Ctx) -> str:
    ctx.watch.append(ctx.checkpoint.parent.parent)
    return str(ctx.checkpoint)


def _read_only_output(ctx: Ctx) -> str:
    folder = ctx.case_dir / "readonly"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(folder, os.W_OK):
        folder.chmod(stat.S_IRWXU)
        raise Skip("a read-only folder is still writable here (running as root)")
    return str(folder / "sub" / "result")


def _output_under_a_file(ctx: Ctx) -> str:
    return os.path.join(ctx.file("blocker", "a file"), "sub", "result")


evaluate("eval-missing-checkpoint", "does not exist", lambda ctx: str(ctx.case_dir / "nope.cleanrl_model"))
evaluate("eval-empty-checkpoint", "empty", lambda ctx: ctx.file("e.cleanrl_model", b""))
evaluate("eval-corrupt-checkpoint", NOT_A_CHECKPOINT, lambda ctx: ctx.file("c.cleanrl_model", garbage(20)))
evaluate("eval-garbage-unpickling", NOT_A_CHECKPOINT, lambda ctx: ctx.file("c.cleanrl_model", garbage(0)))
evaluate("eval-truncated-checkpoint", "truncated", _truncated, ckpt=True)
evaluate("eval-not-a-checkpoint", "missing keys",
         lambda ctx: _torch_file(ctx, "w.cleanrl_model", {"weights": [1.0, 2.0]}))
evaluate("eval-pickled-object", "refused",
         lambda ctx: _torch_file(ctx, "p.cleanrl_model", {"when": datetime.datetime(2020, 1, 1)}))
evaluate("eval-run-dir-without-checkpoints", "no checkpoints", _empty_run_dir)
evaluate("eval-unknown-modification", "foo=1", _shared, "--modifs", "", "foo=1", ckpt=True)
evaluate("eval-bad-modification-value", "gravity=abc", _shared, "--modifs", "gravity=abc", ckpt=True)
evaluate("eval-hackatari-name-on-cartpole", "all_green_cars", _shared, "--modifs", "all_green_cars", ckpt=True)
evaluate("eval-episodes-zero", "eval_episodes", _shared, "--eval_episodes", "0", ckpt=True)
evaluate("eval-episodes-negative", "eval_episodes", _shared, "--eval_episodes=-3", ckpt=True)
evaluate("eval-num-envs-zero", "num_envs", _shared, "--num_envs", "0", ckpt=True)
evaluate("eval-unknown-backend", ("backend", "Gym"), _shared, "--backend", "Gym", ckpt=True)
evaluate("eval-unknown-env-id", ("env_id", "NotAnEnv-v9"), _shared, "--env_id", "NotAnEnv-v9", ckpt=True)
evaluate("eval-hackatari-backend-on-cartpole", "env_id", _shared, "--backend", "HackAtari", ckpt=True)
evaluate("eval-weights-do-not-fit-env", ("do not fit", "trained on CartPole-v1", "evaluated on Acrobot-v1"), _shared,
         "--env_id", "Acrobot-v1", "--eval_episodes", "1", ckpt=True)
evaluate("eval-max-episode-steps-zero", "eval_max_episode_steps", _shared, "--eval_max_episode_steps", "0", ckpt=True)
evaluate("eval-output-read-only", "not writable", _shared, ckpt=True, output=_read_only_output)
evaluate("eval-output-under-a-file", "not writable", _shared, ckpt=True, output=_output_under_a_file)
evaluate("eval-architecture-unknown", ("architecture", "NoSuchArch"),
         lambda ctx: ctx.modified_checkpoint(_no_such_architecture), ckpt=True)
evaluate("eval-architecture-field-mismatch", ("architecture", "IMPALA"), lambda ctx: ctx.modified_checkpoint(_impala),
         ckpt=True)
evaluate("eval-format-version", "format version", lambda ctx: ctx.modified_checkpoint(_format_99), ckpt=True)
evaluate("eval-saved-args-not-a-dict", "args", lambda ctx: ctx.modified_checkpoint(_args_list), ckpt=True)
evaluate("eval-unknown-flag", "--episodes", _shared, "--episodes", "3", ckpt=True)
evaluate("eval-bad-int", "many", _shared, "--eval_episodes", "many", ckpt=True)
evaluate("eval-missing-agent-path", "agent", None)

# --------------------------------------------------------------------------------------------------------------------
# the default run: one case of every kind, about a minute on two cores; the rest is marked slow
# (pytest -m slow tests/test_bad_input.py runs them; pytest -m "" runs all)
# --------------------------------------------------------------------------------------------------------------------

CORE = {
    # config files and types
    "json-invalid-syntax", "json-top-level-array", "json-nan", "json-deeply-nested-lists", "config-is-a-directory",
    "config-missing-file", "type-int-as-string", "type-bool-as-string", "type-literal-architecture",
    "unknown-key-typo",
    # curricula
    "factory-unknown-name", "factory-missing-thresholds", "factory-unknown-kwarg", "thresholds-decreasing",
    "thresholds-wrong-count", "num-total-steps-negative", "probabilities-not-summing-to-1", "epsilon-above-1",
    "num-repetitions-zero", "modifications-empty-list",
    # modification names, ranges, environments, command line
    "hackatari-unknown-modification", "hackatari-typo-in-nested-combined-phase", "gym-bad-value",
    "range-num-envs-negative", "range-gamma-above-1", "total-timesteps-larger-than-curriculum",
    "env-bare-freeway-with-hackatari", "env-box-actions-for-impala", "flag-norm-obs-for-impala", "batched-for-gymnasium", "removed-key-env-groups",
    "compile-on-an-agent-without-it", "cudagraphs-without-cuda",
    "cli-unknown-flag", "cli-literal-lists-choices", "cli-misspelt-flag-suggests", "cli-switch-with-false-points-to-no",
    "env-minatar-id-without-backend",
    "output-run-name-exists", "output-runs-dir-unwritable-for-root", "save-agent-wandb-without-track",
    # --resume and eval.py
    "resume-impala-run-with-the-ppo-file", "resume-missing-file", "resume-truncated-checkpoint", "resume-changes-num-envs", "eval-missing-checkpoint",
    "eval-unknown-modification", "eval-architecture-field-mismatch", "eval-missing-agent-path",
    "eval-weights-do-not-fit-env",
}
assert CORE <= {c.id for c in CASES}, sorted(CORE - {c.id for c in CASES})
# run as real subprocesses (the rest in-process): each script once, a config file, a flag, a checkpoint
SUBPROCESS = {"json-invalid-syntax", "cli-unknown-flag", "resume-truncated-checkpoint",
              "resume-impala-run-with-the-ppo-file", "eval-missing-checkpoint"}
assert SUBPROCESS <= CORE, sorted(SUBPROCESS - CORE)
for _c in CASES:
    _c.slow = _c.id not in CORE

# --------------------------------------------------------------------------------------------------------------------
# runner
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    argv: list[str]
    returncode: Optional[int]
    stdout: str
    stderr: str
    changed: list[str]  # watched folders whose contents changed
    skip: Optional[str] = None
    timed_out: bool = False

    def describe(self) -> str:
        return (f"\n  command: {' '.join(self.argv)}\n  exit code: {self.returncode}"
                f"\n  stderr: {self.stderr[-3000:]!r}\n  stdout tail: {self.stdout[-1500:]!r}")


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONDONTWRITEBYTECODE": "1",
                "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    env.pop("PYTHONWARNINGS", None)
    return env


def snapshot(folder: Path, files_only: bool = False) -> dict[str, tuple[int, int]]:
    """Every entry under `folder` with (size, mtime) for files; folders too unless files_only."""
    if not folder.exists():
        return {}
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), folder)] = (st.st_size, st.st_mtime_ns)
        if not files_only:
            for name in dirs:
                out[os.path.relpath(os.path.join(root, name), folder) + "/"] = (-1, 0)
    return out


def run_as_process(script: str, argv: list[str]) -> tuple[Optional[int], str, str, bool]:
    """`python script argv` from the repository root: (exit code, stdout, stderr, timed out)."""
    try:
        proc = subprocess.run([sys.executable, script, *argv], cwd=REPO_ROOT, env=subprocess_env(),
                              capture_output=True, text=True, timeout=CASE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err, True


def make_checkpoint(base: Path) -> Path:
    runs = base / "runs"
    argv = ["--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2", "--num_steps", "32",
            "--total_timesteps", "128", "--no-progress-bar", "--no-cuda", "--runs_dir", str(runs)]
    proc = run_main(TRAIN, *argv, check=False)
    found = sorted(glob.glob(str(runs / "*" / "checkpoints" / "*.cleanrl_model")))
    if proc.returncode != 0 or len(found) != 1:
        raise RuntimeError(f"could not make the shared checkpoint (exit {proc.returncode}, found {found}):\n"
                           f"{proc.stderr[-3000:]}")
    return Path(found[0])


class Runner:
    """Runs one case at a time (in this process, or as a subprocess for those in SUBPROCESS); the shared checkpoint
    is trained on the first case that needs it."""

    def __init__(self, base: Path):
        self.base = base
        self._checkpoint: Optional[Path] = None

    def checkpoint(self) -> Path:
        if self._checkpoint is None:
            self._checkpoint = make_checkpoint(self.base / "_checkpoint")
        return self._checkpoint

    def run_case(self, c: Case) -> Result:
        case_dir = self.base / c.id
        case_dir.mkdir(parents=True)
        runs_dir = case_dir / "runs"
        ctx = Ctx(case_dir, runs_dir, self.checkpoint)
        try:
            argv = c.build(ctx)
        except Skip as s:
            return Result([], None, "", "", [], skip=str(s))
        if c.script == TRAIN and c.runs_dir_flag:
            argv = ["--runs_dir", str(runs_dir), *argv]
        watched = [runs_dir, *ctx.watch]
        before = {str(w): snapshot(w, c.files_only) for w in watched}
        timed_out = False
        try:
            if c.id in SUBPROCESS:
                rc, out, err, timed_out = run_as_process(c.script, argv)
            else:
                proc = run_main(c.script, *argv, check=False)
                rc, out, err = proc.returncode, proc.stdout, proc.stderr
        finally:
            for w in ctx.case_dir.rglob("*"):  # make read-only test folders removable again
                if w.is_dir() and not os.access(w, os.W_OK):
                    w.chmod(stat.S_IRWXU)
        changed = [w for w in before if snapshot(Path(w), c.files_only) != before[w]]
        how = "python" if c.id in SUBPROCESS else "in-process main():"
        return Result([how, c.script, *argv], rc, out, err, changed, timed_out=timed_out)


@pytest.fixture(scope="module")
def bad_input_runner(tmp_path_factory):
    """One runner for the module: the cases that need a checkpoint share one training run."""
    return Runner(tmp_path_factory.mktemp("bad_input"))


# --------------------------------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_bad_input(case: Case, bad_input_runner):
    result = bad_input_runner.run_case(case)
    if result.skip:
        pytest.skip(result.skip)
    info = result.describe()
    assert not result.timed_out, f"timed out after {CASE_TIMEOUT_S}s{info}"
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, f"traceback printed{info}"
    assert result.returncode == 2, f"expected exit code 2{info}"
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected exactly one non-empty stderr line, got {len(lines)}{info}"
    # validation comes before any output (no resolved configuration printed ahead of the error)
    total = len(result.stdout.splitlines()) + len(result.stderr.splitlines())
    assert total <= 3, f"expected at most 3 lines of output (stdout + stderr), got {total}{info}"
    line = lines[0]
    assert line.startswith("error: ") and line[len("error: "):].strip(), f"stderr must be 'error: ...'{info}"
    for needle in case.expect:
        options = needle if isinstance(needle, AnyOf) else (needle,)
        assert any(o in line for o in options), f"error line does not mention {' or '.join(map(repr, options))}: " \
                                                f"{line!r}{info}"
    assert not result.changed, f"these folders changed (a run or output was created): {result.changed}{info}"


def test_case_count(request):
    """How many malformed inputs this module tries (printed with -s, recorded as a property)."""
    by_script = {s: sum(c.script == s for c in CASES) for s in (TRAIN, EVAL)}
    resume_cases = sum(c.id.startswith("resume-") for c in CASES)
    core = sum(not c.slow for c in CASES)
    request.node.user_properties.append(("bad_input_cases", len(CASES)))
    request.node.user_properties.append(("bad_input_cases_default_run", core))
    print(f"\nbad-input cases: {len(CASES)} ({by_script[TRAIN]} {TRAIN}, of which {resume_cases} --resume; "
          f"{by_script[EVAL]} {EVAL}); {core} in the default run, {len(CASES) - core} more with -m slow")
    # the default run keeps one case of every kind (CORE); the full set runs with -m slow
    assert core == len(CORE) >= 30
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
