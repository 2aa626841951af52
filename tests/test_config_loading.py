"""In-process tests of the configuration layer: defaults < run_config.json < command-line flags.

No environment is created and nothing is trained; every test runs in milliseconds (HackAtari name checks read
hackatari's sources, which takes about a second once).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest

import modification_factories as mf
from conftest import write_config
from continual.config.args import Args, field_names
from continual.config.loading import (
    DEFAULT_TOTAL_TIMESTEPS,
    Curriculum,
    args_from_dict,
    args_to_dict,
    parse_args,
    split_config,
)
from continual.errors import UserError
from continual.training.startup import build_factory, check_modifications, resolve_total

REPO_ROOT = Path(__file__).resolve().parents[1]

CARTPOLE = ["--env_id", "CartPole-v1", "--backend", "Gymnasium"]

SEQ_KWARGS = {
    "num_total_steps": 4096,
    "modifications": ["", "gravity=15.0", "length=0.8"],
    "switching_thresholds": [1024, 2048],
}


def rollout(args: Args) -> int:
    """PPO's rollout size (num_envs x num_steps): the curriculum granularity training uses."""
    return args.num_envs * args.num_steps


def parse_with(tmp_path: Path, config: dict | None, *flags: str) -> tuple[Args, Curriculum]:
    argv: list[str] = []
    if config is not None:
        argv += ["--config", write_config(tmp_path, config)]
    return parse_args(argv + list(flags))


# --------------------------------------------------------------------------------------------------------------------
# defaults
# --------------------------------------------------------------------------------------------------------------------


def test_no_arguments_gives_the_dataclass_defaults():
    args, curriculum = parse_args([])
    assert args == Args()
    assert curriculum == Curriculum()
    assert curriculum.factory is None and curriculum.kwargs == {}


def test_parse_args_does_not_mutate_defaults(tmp_path):
    parse_with(tmp_path, {"num_envs": 3, "exp_name": "x"}, "--seed", "7")
    assert Args().num_envs == 8 and Args().exp_name == "" and Args().seed == 1


# --------------------------------------------------------------------------------------------------------------------
# precedence: defaults < JSON < CLI, per field type
# --------------------------------------------------------------------------------------------------------------------

# (field, JSON value, CLI flags overriding it, expected from JSON alone, expected with the CLI flags)
PRECEDENCE = [
    pytest.param("num_envs", 4, ["--num_envs", "6"], 4, 6, id="int-underscore"),
    pytest.param("num_envs", 4, ["--num-envs", "6"], 4, 6, id="int-dash"),
    pytest.param("num_steps", 64, ["--num-steps=16"], 64, 16, id="int-equals-form"),
    pytest.param("seed", 3, ["--seed", "11"], 3, 11, id="int-seed"),
    pytest.param("learning_rate", 1e-3, ["--learning_rate", "3e-4"], 1e-3, 3e-4, id="float"),
    pytest.param("gamma", 0.9, ["--gamma", "0.5"], 0.9, 0.5, id="float-gamma"),
    pytest.param("ent_coef", 0, ["--ent-coef", "0.02"], 0.0, 0.02, id="float-from-json-int"),
    pytest.param("track", True, ["--no-track"], True, False, id="bool-json-true-cli-no"),
    pytest.param("track", False, ["--track"], False, True, id="bool-json-false-cli-yes"),
    pytest.param("anneal_lr", False, ["--anneal-lr"], False, True, id="bool-default-true-dash"),
    pytest.param("anneal_lr", False, ["--anneal_lr"], False, True, id="bool-default-true-underscore"),
    pytest.param("cuda", True, ["--no-cuda"], True, False, id="bool-no-dash"),
    pytest.param("cuda", True, ["--no_cuda"], True, False, id="bool-no-underscore"),
    pytest.param("progress_bar", False, ["--progress-bar"], False, True, id="bool-progress-bar"),
    pytest.param("target_kl", 0.05, ["--target_kl", "0.01"], 0.05, 0.01, id="optional-float-value"),
    pytest.param("target_kl", 0.05, ["--target_kl", "None"], 0.05, None, id="optional-float-to-none"),
    pytest.param("target_kl", None, ["--target_kl", "0.2"], None, 0.2, id="optional-float-from-null"),
    pytest.param("max_episode_steps", 100, ["--max-episode-steps", "200"], 100, 200, id="optional-int"),
    pytest.param("total_timesteps", 5000, ["--total_timesteps", "None"], 5000, None, id="optional-int-to-none"),
    pytest.param("wandb_entity", "team", ["--wandb_entity", "me"], "team", "me", id="optional-str"),
    pytest.param("architecture", "PPO_CBP", ["--architecture", "IMPALA"], "PPO_CBP", "IMPALA", id="literal"),
    pytest.param("reward_scaling", "normalize", ["--reward-scaling", "none"], "normalize", "none",
                 id="literal-dash"),
    pytest.param("vector_env", "sync", ["--vector_env", "async"], "sync", "async", id="literal-vector-env"),
    pytest.param("exp_name", "from_json", ["--exp_name", "from_cli"], "from_json", "from_cli", id="str"),
    pytest.param("modifs", "gravity=12", ["--modifs", "length=0.8 gravity=9"], "gravity=12",
                 "length=0.8 gravity=9", id="str-modifs"),
]


@pytest.mark.parametrize("field,json_value,flags,from_json,from_cli", PRECEDENCE)
def test_precedence_defaults_json_cli(tmp_path, field, json_value, flags, from_json, from_cli):
    default = getattr(Args(), field)
    config = {"env_id": "CartPole-v1", "backend": "Gymnasium", field: json_value}

    args, _ = parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium"})
    assert getattr(args, field) == default, "a field the config does not set keeps its default"

    args, _ = parse_with(tmp_path, config)
    assert getattr(args, field) == from_json
    assert type(getattr(args, field)) is type(from_json)

    args, _ = parse_with(tmp_path, config, *flags)
    assert getattr(args, field) == from_cli
    assert type(getattr(args, field)) is type(from_cli)


@pytest.mark.parametrize("flags,field,expected", [
    pytest.param(["--num_envs", "5"], "num_envs", 5, id="int"),
    pytest.param(["--learning-rate", "0.01"], "learning_rate", 0.01, id="float"),
    pytest.param(["--track"], "track", True, id="bool"),
    pytest.param(["--no-torch-deterministic"], "torch_deterministic", False, id="bool-no"),
    pytest.param(["--target-kl", "0.03"], "target_kl", 0.03, id="optional"),
    pytest.param(["--obs_mode", "obj"], "obs_mode", "obj", id="literal"),
])
def test_cli_without_config_overrides_defaults(field, flags, expected):
    args, curriculum = parse_args(CARTPOLE + flags)
    assert getattr(args, field) == expected
    assert curriculum == Curriculum()


def test_cli_wins_even_when_given_before_config(tmp_path):
    path = write_config(tmp_path, {"num_envs": 4, "seed": 5, "env_id": "CartPole-v1", "backend": "Gymnasium"})
    args, _ = parse_args(["--num_envs", "2", "--config", path])
    assert args.num_envs == 2
    assert args.seed == 5


def test_many_fields_at_once_mix_the_three_sources(tmp_path):
    config = {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 4, "learning_rate": 0.001,
              "track": True, "target_kl": 0.02, "architecture": "PPO_CBP", "exp_name": "json"}
    args, _ = parse_with(tmp_path, config, "--num-envs", "2", "--no-track", "--architecture", "PPO")
    assert (args.num_envs, args.track, args.architecture) == (2, False, "PPO")  # CLI
    assert (args.learning_rate, args.target_kl, args.exp_name) == (0.001, 0.02, "json")  # JSON
    assert (args.seed, args.gamma, args.num_steps) == (1, 0.99, 128)  # defaults
    assert args.config is not None and args.config.endswith("run_config.json")


# --------------------------------------------------------------------------------------------------------------------
# flag spellings and --config forms
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--env_id", "--env-id"])
def test_env_id_both_spellings(flag):
    args, _ = parse_args([flag, "CartPole-v1", "--backend", "Gymnasium"])
    assert args.env_id == "CartPole-v1"


@pytest.mark.parametrize("flag", ["--num_envs", "--num-envs"])
def test_num_envs_both_spellings(flag):
    args, _ = parse_args(CARTPOLE + [flag, "3"])
    assert args.num_envs == 3


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_config_path_forms(tmp_path, form):
    path = write_config(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 5,
                                   "modification_factory": "SequentialModificationFactory",
                                   "modification_factory_kwargs": SEQ_KWARGS})
    argv = ["--config", path] if form == "separate" else [f"--config={path}"]
    args, curriculum = parse_args(argv)
    assert args.num_envs == 5
    assert args.config == path
    assert curriculum.factory == "SequentialModificationFactory"
    assert curriculum.kwargs == SEQ_KWARGS


def test_config_flag_without_path_is_a_user_error():
    with pytest.raises(UserError, match="--config"):
        parse_args(["--config"])


@pytest.mark.parametrize("path", ["run_config.json", "configs/cartpole_gravity.json"])
def test_shipped_configs_parse(path):
    args, curriculum = parse_args(["--config", str(REPO_ROOT / path)])
    data = json.loads((REPO_ROOT / path).read_text())
    for key, value in data.items():
        if key.startswith("_") or key in ("modification_factory", "modification_factory_kwargs"):
            continue
        assert getattr(args, key) == value, key
    assert curriculum.factory == data["modification_factory"]
    assert curriculum.kwargs == data["modification_factory_kwargs"]


# --------------------------------------------------------------------------------------------------------------------
# JSON value handling
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,json_text,expected", [
    pytest.param("total_timesteps", "1e5", 100000, id="optional-int-1e5"),
    pytest.param("num_envs", "4.0", 4, id="int-4.0"),
    pytest.param("num_steps", "1.6e1", 16, id="int-1.6e1"),
    pytest.param("checkpoint_every", "2E3", 2000, id="int-2E3"),
    pytest.param("max_episode_steps", "5e2", 500, id="optional-int-5e2"),
])
def test_json_integral_floats_accepted_for_int_fields(tmp_path, field, json_text, expected):
    text = '{"env_id": "CartPole-v1", "backend": "Gymnasium", "%s": %s}' % (field, json_text)
    args, _ = parse_args(["--config", write_config(tmp_path, text)])
    value = getattr(args, field)
    assert value == expected
    assert type(value) is int


@pytest.mark.parametrize("json_text", ["4.5", "1e-3", "true", '"4"'])
def test_json_non_integral_values_rejected_for_int_fields(tmp_path, json_text):
    text = '{"num_envs": %s}' % json_text
    with pytest.raises(UserError, match="num_envs"):
        parse_args(["--config", write_config(tmp_path, text)])


def test_json_int_becomes_float_for_float_fields(tmp_path):
    args, _ = parse_with(tmp_path, {"learning_rate": 1, "gamma": 1})
    assert args.learning_rate == 1.0 and type(args.learning_rate) is float
    assert type(args.gamma) is float


def test_json_null_for_optional_fields(tmp_path):
    args, _ = parse_with(tmp_path, {"total_timesteps": None, "target_kl": None, "run_name": None})
    assert args.total_timesteps is None and args.target_kl is None and args.run_name is None


def test_comment_keys_are_ignored(tmp_path):
    config = {"_comment": "free text", "_note": {"nested": [1, 2, {"x": None}]}, "_": 5, "__private": "x",
              "_num_envs": "not a number", "num_envs": 3}
    args, curriculum = parse_with(tmp_path, config)
    assert args.num_envs == 3
    assert dataclasses.replace(args, num_envs=8, config=None) == Args()
    assert curriculum == Curriculum()


def test_only_comment_keys_is_a_valid_config(tmp_path):
    args, curriculum = parse_with(tmp_path, {"_comment": "nothing else"})
    assert dataclasses.replace(args, config=None) == Args()
    assert curriculum == Curriculum()


def test_empty_object_is_a_valid_config(tmp_path):
    args, curriculum = parse_with(tmp_path, {})
    assert dataclasses.replace(args, config=None) == Args()
    assert curriculum == Curriculum()


def test_curriculum_keys_returned_and_not_args_fields(tmp_path):
    kwargs = {"num_total_steps": 1000, "modifications": ["", "gravity=12"], "probabilities": [0.5, 0.5],
              "num_repetitions": 2}
    args, curriculum = parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium",
                                             "modification_factory": "RandomModificationFactory",
                                             "modification_factory_kwargs": kwargs})
    assert curriculum == Curriculum("RandomModificationFactory", kwargs)
    assert not hasattr(args, "modification_factory")
    assert "modification_factory" not in field_names()


def test_factory_without_kwargs_gives_empty_kwargs(tmp_path):
    _, curriculum = parse_with(tmp_path, {"modification_factory": "NoModification"})
    assert curriculum == Curriculum("NoModification", {})


def test_kwargs_without_factory_is_an_error(tmp_path):
    with pytest.raises(UserError, match="modification_factory"):
        parse_with(tmp_path, {"modification_factory_kwargs": {"num_total_steps": 5}})


def test_unknown_key_suggests_the_field(tmp_path):
    with pytest.raises(UserError, match="did you mean 'num_envs'"):
        parse_with(tmp_path, {"num_env": 4})


@pytest.mark.parametrize("key", ["config", "resume"])
def test_config_and_resume_cannot_be_set_in_a_config(tmp_path, key):
    with pytest.raises(UserError, match=key):
        parse_with(tmp_path, {key: "x"})


def _other_value(tp: Any, default: Any) -> Any:
    """A JSON value of type `tp` different from `default` (no range knowledge: for split_config only)."""
    origin, targs = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in targs if a is not type(None)]
        return _other_value(inner, default if default is not None else _zero(inner))
    if origin is typing.Literal:
        return next(a for a in targs if a != default)
    if tp is bool:
        return not default
    if tp is int:
        return default + 1
    if tp is float:
        return default + 0.5
    if tp is str:
        return default + "_x"
    raise AssertionError(f"no JSON value for {tp!r}: extend _other_value")


def _zero(tp: Any) -> Any:
    return {bool: False, int: 0, float: 0.0, str: ""}.get(tp, None)


def test_every_field_has_a_json_type_check():
    """Every Args field (present and future) can be set from a config file, with its type kept."""
    hints = typing.get_type_hints(Args)
    defaults = Args()
    for f in dataclasses.fields(Args):
        if f.name in ("config", "resume"):
            continue
        value = _other_value(hints[f.name], getattr(defaults, f.name))
        fields, curriculum = split_config({f.name: value}, "test")
        assert fields == {f.name: value}, f.name
        assert type(fields[f.name]) is type(value), f.name
        assert curriculum == Curriculum()


def test_every_field_can_be_set_from_json(tmp_path):
    """The original training fields round-trip through a config file with a valid non-default value."""
    non_default: dict[str, Any] = {
        "exp_name": "e", "run_name": "r", "runs_dir": "elsewhere", "architecture": "IMPALA", "seed": 9,
        "torch_deterministic": False, "cuda": False, "total_timesteps": 1234, "env_id": "CartPole-v1",
        "backend": "Gymnasium", "obs_mode": "obj", "modifs": "gravity=3", "num_envs": 2, "vector_env": "sync",
        "frameskip": 2, "buffer_window_size": 2, "repeat_action_probability": 0.0, "noop_max": 0,
        "deactivate_episodic_life": True, "reward_scaling": "none", "max_episode_steps": 50,
        "learning_rate": 0.1, "anneal_lr": False, "num_steps": 8, "gamma": 0.5, "gae_lambda": 0.5,
        "num_minibatches": 2, "update_epochs": 1, "norm_adv": False, "clip_coef": 0.3, "clip_vloss": False,
        "ent_coef": 0.0, "vf_coef": 1.0, "max_grad_norm": 1.0, "target_kl": 0.1, "track": True,
        "wandb_project_name": "p", "wandb_entity": "ent", "wandb_dir": "wd", "capture_video": True,
        "video_every": 3, "save_agent_with_switch": True, "save_agent_wandb": True, "checkpoint_every": 64,
        "checkpoint_minutes": 0.5, "keep_checkpoints": 1, "progress_bar": False,
    }
    assert set(non_default) <= field_names(), "a field was renamed or removed: update this test"
    args, _ = parse_with(tmp_path, non_default)
    for key, value in non_default.items():
        assert getattr(args, key) == value, key
        assert getattr(args, key) != getattr(Args(), key), key


def test_args_round_trip_through_a_saved_dict(tmp_path):
    args, _ = parse_with(tmp_path, {"num_envs": 3, "target_kl": 0.1, "track": True, "env_id": "CartPole-v1",
                                    "backend": "Gymnasium"}, "--seed", "4")
    data = json.loads(json.dumps(args_to_dict(args)))
    assert args_from_dict(data) == dataclasses.replace(args, config=None, resume=None)


def test_split_config_skips_comments_and_separates_curriculum():
    fields, curriculum = split_config({"_c": 1, "num_envs": 2.0, "modification_factory": "NoModification",
                                       "modification_factory_kwargs": {"num_total_steps": 10}}, "test")
    assert fields == {"num_envs": 2} and type(fields["num_envs"]) is int
    assert curriculum == Curriculum("NoModification", {"num_total_steps": 10})


# --------------------------------------------------------------------------------------------------------------------
# build_factory / resolve_total / constant curriculum
# --------------------------------------------------------------------------------------------------------------------


def cartpole_curriculum(tmp_path: Path, *flags: str, kwargs: dict | None = None) -> tuple[Args, Curriculum]:
    return parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 4, "num_steps": 64,
                                 "modification_factory": "SequentialModificationFactory",
                                 "modification_factory_kwargs": kwargs or SEQ_KWARGS}, *flags)


def test_total_timesteps_defaults_to_the_curriculum_length(tmp_path):
    args, curriculum = cartpole_curriculum(tmp_path)
    assert args.total_timesteps is None
    factory = build_factory(args, curriculum, rollout(args))
    assert isinstance(factory, mf.SequentialModificationFactory)
    assert factory.total_timesteps == SEQ_KWARGS["num_total_steps"]
    assert resolve_total(args, factory, rollout(args)) == SEQ_KWARGS["num_total_steps"]


def test_total_timesteps_from_json_1e3_style(tmp_path):
    text = json.dumps({"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 4, "num_steps": 64,
                       "modification_factory": "SequentialModificationFactory",
                       "modification_factory_kwargs": SEQ_KWARGS}).replace('"num_envs": 4',
                                                                            '"num_envs": 4, "total_timesteps": 2.048e3')
    args, curriculum = parse_args(["--config", write_config(tmp_path, text)])
    factory = build_factory(args, curriculum, rollout(args))
    assert resolve_total(args, factory, rollout(args)) == 2048


def test_num_total_steps_as_json_float_is_accepted(tmp_path):
    kwargs = dict(SEQ_KWARGS, num_total_steps=4.096e3, switching_thresholds=[1.024e3, 2048.0])
    args, curriculum = cartpole_curriculum(tmp_path, kwargs=kwargs)
    factory = build_factory(args, curriculum, rollout(args))
    assert factory.total_timesteps == 4096


@pytest.mark.parametrize("total", [256, 1024, 4096])
def test_explicit_total_up_to_the_curriculum_length_is_kept(tmp_path, total):
    args, curriculum = cartpole_curriculum(tmp_path, "--total_timesteps", str(total))
    factory = build_factory(args, curriculum, rollout(args))
    assert factory.total_timesteps == SEQ_KWARGS["num_total_steps"]
    assert resolve_total(args, factory, rollout(args)) == total


@pytest.mark.parametrize("total", [4097, 10_000, 10**12])
def test_total_larger_than_the_curriculum_is_rejected(tmp_path, total):
    args, curriculum = cartpole_curriculum(tmp_path, "--total_timesteps", str(total))
    factory = build_factory(args, curriculum, rollout(args))
    with pytest.raises(UserError, match="total_timesteps") as info:
        resolve_total(args, factory, rollout(args))
    assert str(total) in str(info.value) and "4096" in str(info.value)


def test_total_smaller_than_one_rollout_trains_one_rollout(tmp_path):
    args, curriculum = cartpole_curriculum(tmp_path, "--total_timesteps", "100")
    factory = build_factory(args, curriculum, rollout(args))
    assert resolve_total(args, factory, rollout(args)) == rollout(args)  # rounded up, said by a note line


def test_curriculum_shorter_than_one_rollout_trains_one_rollout(tmp_path):
    kwargs = {"num_total_steps": 100, "modifications": [""], "switching_thresholds": []}
    args, curriculum = cartpole_curriculum(tmp_path, kwargs=kwargs)
    factory = build_factory(args, curriculum, rollout(args))
    assert resolve_total(args, factory, rollout(args)) == rollout(args)


def test_factory_config_errors_become_user_errors(tmp_path):
    args, curriculum = cartpole_curriculum(tmp_path, kwargs=dict(SEQ_KWARGS, switching_thresholds=[2048, 1024]))
    with pytest.raises(UserError, match="switching_thresholds"):
        build_factory(args, curriculum, rollout(args))


def test_unknown_factory_becomes_a_user_error(tmp_path):
    args, _ = parse_args(CARTPOLE)
    with pytest.raises(UserError, match="NoSuchFactory"):
        build_factory(args, Curriculum("NoSuchFactory", {}), rollout(args))


@pytest.mark.parametrize("modifs", ["", "gravity=12", "length=0.8 gravity=12"])
def test_no_config_gives_a_constant_curriculum_of_modifs(modifs):
    args, curriculum = parse_args(CARTPOLE + ["--modifs", modifs, "--total_timesteps", "8192"])
    assert curriculum.factory is None
    granularity = rollout(args)
    factory = build_factory(args, curriculum, granularity)
    expected = mf.normalize_modification(modifs)
    assert factory.possible_modifications() == [expected]
    assert factory.total_timesteps == 8192
    assert resolve_total(args, factory, granularity) == 8192
    for step in (0, granularity, 4096, 8191):
        assert factory.get_modification(step) == expected
    assert check_modifications(args, factory, [args.modifs]) == [expected]


def test_no_config_and_no_total_uses_the_default_length():
    args, curriculum = parse_args(CARTPOLE + ["--modifs", "gravity=12"])
    factory = build_factory(args, curriculum, rollout(args))
    assert factory.total_timesteps == DEFAULT_TOTAL_TIMESTEPS
    assert resolve_total(args, factory, rollout(args)) == -(-DEFAULT_TOTAL_TIMESTEPS // 1024) * 1024  # whole rollouts
    assert factory.possible_modifications() == ["gravity=12"]


def test_seed_reaches_the_factory(tmp_path):
    kwargs = {"num_total_steps": 4096, "modifications": ["", "gravity=12", "gravity=5"], "num_repetitions": 1}
    schedules = []
    for seed in ("1", "1", "2"):
        args, curriculum = parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 1,
                                                 "num_steps": 16, "modification_factory": "RandomModificationFactory",
                                                 "modification_factory_kwargs": kwargs}, "--seed", seed)
        factory = build_factory(args, curriculum, rollout(args))
        schedules.append([factory.get_modification(s) for s in range(0, 4096, 16)])
    assert schedules[0] == schedules[1]
    assert schedules[0] != schedules[2]


def test_check_modifications_on_shipped_cartpole_config():
    args, curriculum = parse_args(["--config", str(REPO_ROOT / "configs/cartpole_gravity.json")])
    factory = build_factory(args, curriculum, rollout(args))
    regimes = check_modifications(args, factory, [args.modifs])
    assert set(regimes) == {"", "gravity=15.0", "length=0.8", "gravity=5.0 length=0.3"}
    assert resolve_total(args, factory, rollout(args)) == 120064  # 120,000 steps: 469 rollouts of 8 x 32


def test_check_modifications_on_shipped_freeway_config():
    args, curriculum = parse_args(["--config", str(REPO_ROOT / "run_config.json")])
    factory = build_factory(args, curriculum, rollout(args))
    regimes = check_modifications(args, factory, [args.modifs])
    assert "disable_cars" in regimes and "" in regimes
    assert "all_green_cars reverse_car_speed_top" in regimes


def test_check_modifications_rejects_a_bad_gymnasium_token(tmp_path):
    args, curriculum = cartpole_curriculum(tmp_path, kwargs=dict(SEQ_KWARGS, modifications=["", "gravity=abc",
                                                                                             "length=1"]))
    factory = build_factory(args, curriculum, rollout(args))
    with pytest.raises(UserError, match="gravity=abc"):
        check_modifications(args, factory, [args.modifs])


# --------------------------------------------------------------------------------------------------------------------
# validate_args range checks (in-process; the subprocess versions are in test_bad_input.py)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags,field", [
    (["--num_envs", "0"], "num_envs"),
    (["--num_steps", "-1"], "num_steps"),
    (["--learning_rate", "0"], "learning_rate"),
    (["--learning_rate", "nan"], "learning_rate"),
    (["--gamma", "1.01"], "gamma"),
    (["--gae_lambda", "-0.1"], "gae_lambda"),
    (["--repeat_action_probability", "inf"], "repeat_action_probability"),
    (["--ent_coef", "-1"], "ent_coef"),
    (["--noop_max", "-1"], "noop_max"),
    (["--envs_per_worker", "-1"], "envs_per_worker"),
    (["--total_timesteps", "0"], "total_timesteps"),
    (["--max_episode_steps", "0"], "max_episode_steps"),
    (["--target_kl", "0"], "target_kl"),
    (["--num_envs", "1", "--num_steps", "2", "--num_minibatches", "4"], "num_minibatches"),
    (["--run_name", "a/b"], "run_name"),
    (["--run_name", ".."], "run_name"),
    (["--adam_beta1", "1"], "adam_beta1"),
    (["--adam_beta2", "nan"], "adam_beta2"),
    (["--architecture", "IMPALA", "--adam_beta1", "0.99"], "adam_beta1: supported by PPO and PPO_CBP, not IMPALA"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_validate_args_ranges(flags, field):
    with pytest.raises(UserError, match=field):
        parse_args(CARTPOLE + flags)


def test_hackatari_needs_a_full_ale_id():
    with pytest.raises(UserError, match="env_id"):
        parse_args(["--env_id", "Freeway"])
    args, _ = parse_args(["--env_id", "Freeway", "--backend", "Gymnasium"])
    assert args.env_id == "Freeway"


# --------------------------------------------------------------------------------------------------------------------
# issue 12: flags win over run_config.json and say so; whole curricula; one config, one schedule for every agent
# --------------------------------------------------------------------------------------------------------------------


def test_flag_overriding_a_config_key_prints_one_note(tmp_path, capsys):
    args, _ = parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium", "architecture": "PPO_CBP",
                                    "total_timesteps": 8192, "learning_rate": 0.001},
                         "--architecture", "PPO", "--total_timesteps", "4096", "--learning_rate", "0.001")
    assert args.architecture == "PPO" and args.total_timesteps == 4096  # flags win
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["note: --architecture PPO overrides run_config.json's \"PPO_CBP\"",
                     "note: --total_timesteps 4096 overrides run_config.json's 8192"]


@pytest.mark.parametrize("flags", [[], ["--architecture", "PPO_CBP"], ["--seed", "3"], ["--env_id", "CartPole-v1"]],
                         ids=["no flags", "flag equals config", "key not in config", "env_id equal"])
def test_no_override_note_when_nothing_is_overridden(tmp_path, capsys, flags):
    parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium", "architecture": "PPO_CBP"}, *flags)
    assert "note:" not in capsys.readouterr().out


def test_no_override_note_without_a_config(capsys):
    parse_args(CARTPOLE + ["--architecture", "PPO"])
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize("curriculum_steps,flag,rollout,expected", [
    (2000, None, 1024, 2048),    # the seed's example: 2 rollouts, the second reaches phase 2 (starts at 1000)
    (4096, None, 1024, 4096),    # exact: nothing rounded
    (500, None, 1024, 1024),     # shorter than one rollout: one rollout
    (4096, 1500, 1024, 2048),    # --total_timesteps is rounded up the same way
    (1000, None, 320, 1280),     # IMPALA-sized rollouts
])
def test_total_steps_round_the_last_rollout_up(curriculum_steps, flag, rollout, expected):
    from continual.training.startup import rounding_note

    argv = CARTPOLE + (["--total_timesteps", str(flag)] if flag else [])
    args, _ = parse_args(argv)
    factory = mf.make_factory("NoModification", {"num_total_steps": curriculum_steps})
    total = resolve_total(args, factory, rollout)
    assert total == expected and total % rollout == 0
    asked = flag or curriculum_steps
    assert total - rollout < asked <= total  # the last rollout starts inside the curriculum
    note = rounding_note(args, factory, rollout, total)
    if expected == asked:
        assert note is None
    else:
        assert f"{asked} steps rounded up to {expected} = {expected // rollout} rollouts of {rollout} steps" in note


SEED_EXAMPLE = {  # the seed document's run_config.json example, verbatim
    "modification_factory": "EpsCombinedModificationFactory",
    "modification_factory_kwargs": {
        "modification_factory_kwargs": {
            "SequentialModificationFactory": {"num_total_steps": 1000, "modifications": ["disable_cars"],
                                              "switching_thresholds": []},
            "AllCombinationsRandomModificationFactory": {
                "num_total_steps": 1000,
                "modifications": [["all_green_cars", "all_pink_cars", "all_white_cars", "all_blue_cars"],
                                  ["", "reverse_car_speed_bottom", "reverse_car_speed_top"]],
                "num_repetitions": 20}},
        "epsilon": 0.005}}


def test_seed_example_config_reaches_its_second_phase(tmp_path):
    """The seed's example with the default 8 x 128 rollout: 2,000 steps train 2 rollouts (2,048 steps), the second
    in the second phase, and the run says how it rounded."""
    from conftest import run_main
    from continual.training.tracking import read_metrics

    cfg = write_config(tmp_path, SEED_EXAMPLE)
    runs = tmp_path / "runs"
    proc = run_main("continual_training_example.py", "--config", cfg, "--runs_dir", str(runs), "--run_name", "seed",
                    "--update_epochs", "1", "--no-progress-bar")
    assert ("note: the curriculum's 2000 steps rounded up to 2048 = 2 rollouts of 1024 steps" in proc.stdout), \
        proc.stdout
    records = read_metrics(str(runs / "seed" / "metrics.jsonl"))
    assert [r["global_step"] for r in records if r["kind"] == "iteration"] == [1024, 2048]
    switches = [(r["global_step"], r["modification"]) for r in records if r["kind"] == "switch"]
    phase2 = set(mf.make_factory("AllCombinationsRandom", SEED_EXAMPLE["modification_factory_kwargs"][
        "modification_factory_kwargs"]["AllCombinationsRandomModificationFactory"]).possible_modifications())
    assert len(switches) == 1 and switches[0][0] == 1024 and switches[0][1] in phase2
    assert (runs / "seed" / "checkpoints" / "final__step2048.cleanrl_model").exists()
    assert json.loads((runs / "seed" / "config.json").read_text())["resolved_total_timesteps"] == 2048


RANDOM_STEPS = {"num_total_steps": 2048, "modifications": ["", "gravity=15", "length=0.8", "gravity=5 length=0.3"],
                "num_repetitions": 256}


def impala_steps_per_update(args: Args) -> int:
    """agents/impala.py: batch_size unrolls of unroll_length steps from num_envs / num_actors envs each."""
    return args.batch_size * args.unroll_length * (args.num_envs // args.num_actors)


@pytest.mark.parametrize("config", [
    {"modification_factory": "RandomModificationFactory", "modification_factory_kwargs": RANDOM_STEPS},
    {**SEED_EXAMPLE, "env_id": "ALE/Freeway-v5"},
    {"modification_factory": "EpsSequentialModificationFactory", "modification_factory_kwargs": {
        "num_total_steps": 4096, "modifications": ["", "gravity=15", "length=0.8"],
        "switching_thresholds": [1000, 3000], "epsilon": 0.2}},
], ids=["random", "seed example", "eps sequential"])
def test_one_config_one_schedule_under_ppo_and_impala(tmp_path, config):
    base = {"env_id": "CartPole-v1", "backend": "Gymnasium", **config}
    schedules = []
    for flags in (["--architecture", "PPO"], ["--architecture", "PPO", "--num_envs", "2", "--num_steps", "32"],
                  ["--architecture", "IMPALA"], ["--architecture", "IMPALA", "--unroll_length", "16"]):
        args, curriculum = parse_with(tmp_path, base, *flags)
        rollout = impala_steps_per_update(args) if args.architecture == "IMPALA" else args.rollout_size()
        factory = build_factory(args, curriculum, rollout)
        schedules.append(factory.schedule(1))
        # what the agent applies: the schedule at each rollout start
        for start in range(0, factory.total_timesteps, rollout):
            assert factory.get_modification(start) == next(m for s, e, m in schedules[0] if s <= start < e)
    assert all(s == schedules[0] for s in schedules[1:])
    assert len(schedules[0]) > 2
    if config["modification_factory"] == "RandomModificationFactory":  # num_repetitions counts steps
        assert all((end - start) % 256 == 0 for start, end, _ in schedules[0])


def test_ppo_and_impala_runs_switch_at_the_same_steps(tmp_path):
    """One config, trained by PPO (2 x 32-step rollouts) and IMPALA (128 steps per update): num_repetitions counts
    steps, so both see the same draws at the same steps."""
    from conftest import run_main
    from continual.training.tracking import read_metrics

    cfg = write_config(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 32,
                                  "update_epochs": 1, "num_actors": 2, "unroll_length": 16, "batch_size": 4,
                                  "reward_scaling": "none", "modification_factory": "RandomModificationFactory",
                                  "modification_factory_kwargs": RANDOM_STEPS})
    runs = tmp_path / "runs"
    switches = {}
    for arch in ("PPO", "IMPALA"):
        run_main("continual_training_example.py", "--config", cfg, "--architecture", arch, "--runs_dir", str(runs),
                 "--run_name", arch, "--seed", "2", "--no-progress-bar")
        switches[arch] = [(r["global_step"], r["modification"])
                          for r in read_metrics(str(runs / arch / "metrics.jsonl")) if r["kind"] == "switch"]
    factory = mf.make_factory("Random", RANDOM_STEPS, seed=2)
    expected = [(s, m) for s, _, m in factory.schedule()[1:]]
    assert switches["PPO"] == switches["IMPALA"] == expected and len(expected) >= 2


def test_resume_keeps_the_granularity_the_run_started_with(tmp_path):
    """A checkpoint from before built-in curricula were per step holds the rollout size: the resumed run rebuilds
    that factory (same schedule), and its state dict matches the checkpoint's."""
    args, curriculum = parse_with(tmp_path, {"env_id": "CartPole-v1", "backend": "Gymnasium",
                                             "modification_factory": "RandomModificationFactory",
                                             "modification_factory_kwargs": RANDOM_STEPS})
    old = mf.make_factory("RandomModificationFactory", RANDOM_STEPS, seed=args.seed, granularity=64)
    resumed = build_factory(args, curriculum, 64, saved_granularity=old.granularity)
    resumed.load_state_dict(old.state_dict())
    assert resumed.schedule() == old.schedule()
    assert build_factory(args, curriculum, 64).granularity == 1


def test_removed_keys_load_at_their_neutral_value_and_refuse_any_other():
    """env_groups went in issue 27: a saved run's config with env_groups=1 still loads (resume, eval.py); any other
    value is one UserError naming the key, never a silent change of what the run did."""
    from continual.config.loading import args_from_dict

    fields, _ = split_config({"env_groups": 1, "num_envs": 4}, "test")
    assert fields == {"num_envs": 4}
    assert args_from_dict({**dataclasses.asdict(Args()), "env_groups": 1}).num_envs == Args().num_envs
    with pytest.raises(UserError, match=r"env_groups was removed .*only env_groups=1"):
        split_config({"env_groups": 2}, "test")


def _through_tyro(argv: list[str]) -> Args:
    """parse_args's result the long way: tyro's parser over the same defaults (the path a flag besides --config
    takes)."""
    from continual.config import loading
    from continual.config.args import default_args

    fields, _ = split_config(json.loads(Path(argv[-1].removeprefix("--config=")).read_text()), "config")
    defaults = dataclasses.replace(default_args(fields.get("architecture", "PPO")), **fields)
    return loading.cli(Args, argv, default=defaults)


RUN_CONFIGS = [p for p in sorted((REPO_ROOT / "configs").glob("*.json")) if not p.name.startswith("experiment")]


@pytest.mark.parametrize("path", RUN_CONFIGS + [REPO_ROOT / "run_config.json"], ids=lambda p: p.name)
def test_a_config_only_command_line_skips_tyro_with_the_same_args(path, monkeypatch):
    """`--config PATH` alone (a config-only run, every launcher entry) is not handed to tyro: the Args are those
    tyro's parser gives for the same command line, field by field, for every shipped config; tyro is not called."""
    expected = _through_tyro(["--config", str(path)])
    from continual.config import loading

    def no_tyro(*a, **k):
        raise AssertionError("tyro called")
    monkeypatch.setattr(loading, "cli", no_tyro)
    for argv in (["--config", str(path)], [f"--config={path}"]):
        args, _ = parse_args(argv)
        assert dataclasses.asdict(args) == {**dataclasses.asdict(expected), "config": str(path)}
        assert all(type(getattr(args, f.name)) is type(getattr(expected, f.name)) for f in dataclasses.fields(Args))


@pytest.mark.parametrize("every_arm", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["first_arm", "every_arm"])
@pytest.mark.parametrize("path", sorted((REPO_ROOT / "configs" / "experiments").glob("*.json")), ids=lambda p: p.name)
def test_experiment_entries_validate_to_the_args_tyro_gives(path, every_arm, tmp_path):
    """The launcher's validation reads each entry as `--config FILE` alone (its scratch runs_dir and run_name in the
    file): for the first entry of every shipped experiment (`-m slow`: of every arm; 70 CPU-s, a tyro parser per
    arm), the Args equal tyro's for that command line."""
    from continual.launch.experiment import load_experiment, run_config

    experiment = load_experiment(str(path), resolve_chosen=False, stand_ins=True)
    arms = {}
    for entry in experiment.entries:
        arms.setdefault(entry.config.get("exp_name") or entry.label, entry)
    for entry in list(arms.values())[:None if every_arm else 1]:
        file = tmp_path / f"{entry.name}.json"
        file.write_text(json.dumps({**run_config(entry, experiment.name), "runs_dir": str(tmp_path / "runs"),
                                    "run_name": entry.name}))
        args, _ = parse_args(["--config", str(file)])
        assert dataclasses.asdict(args) == dataclasses.asdict(_through_tyro(["--config", str(file)])), entry.name
