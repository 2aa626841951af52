"""continual.modstrings: the one canonical form of modification strings, used by envs, curricula, evaluation and
metrics (they had three copies; the env-side one refused lists, the curriculum one accepted them)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import pytest

import continual.curricula as curricula
import continual.envs.backends as backends
import continual.envs.vector as vector
import continual.evaluation.continual as ceval
import continual.evaluation.metrics as metrics
import continual.modstrings as modstrings
import helpers.modstrings_reference as reference
from continual.errors import UserError
from continual.modstrings import (
    game_name,
    modification_tokens,
    normalize_modification,
    parse_task,
    parse_tasks,
    task_env_ids,
)
from helpers.modstrings_cases import CASES


@pytest.mark.parametrize("raw, expected", [
    ("", ""), ("  ", ""), ("b a", "a b"), ("a  b\ta", "a b"), (["b", "a c"], "a b c"), (("x",), "x"), ([], ""),
])
def test_canonical_form(raw, expected):
    assert normalize_modification(raw) == expected
    assert modification_tokens(raw) == (expected.split() if expected else [])


@pytest.mark.parametrize("bad", [None, 3, ["a", 1]])
def test_bad_types_are_refused(bad):
    with pytest.raises(TypeError):
        normalize_modification(bad)


def test_one_definition_everywhere():
    assert curricula.normalize_modification is normalize_modification
    for module in (vector, ceval, metrics):
        assert module.normalize_modification is normalize_modification
        assert not hasattr(module, "normalize")
    assert backends.game_name is game_name
    for module in (backends, vector, ceval, metrics):  # the old per-caller parsers are gone
        assert not any(hasattr(module, name) for name in ("split_task", "task_env_id", "parse_minatar_tokens",
                                                          "parse_parameter_tokens"))


def test_a_task_is_parsed_once_per_string():
    task = parse_task("  permute_obs=3 env=MinAtar/Freeway  b", "MinAtar", "MinAtar/Breakout")
    assert (task.text, task.env, task.env_id, task.backend) == (
        "b env=MinAtar/Freeway permute_obs=3", "MinAtar/Freeway", "MinAtar/Freeway", "MinAtar")
    assert task.tokens == ("b", "permute_obs=3") and task.parameters == (("b", None), ("permute_obs", "3"))
    assert task.modification == "b permute_obs=3" and task.game == "Freeway"
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.text = "x"  # type: ignore[misc]
    assert parse_task("b a", "MinAtar", "MinAtar/Breakout").env_id == "MinAtar/Breakout"
    text = "  a_string_nobody_parsed b b"
    assert text not in modstrings._PARSED and "a_string_nobody_parsed b" not in modstrings._PARSED
    tasks = [parse_task(text, backend, env_id) for backend, env_id in (("HackAtari", "ALE/Freeway-v5"),
                                                                       ("OCAtari", "ALE/Pong-v5"))]
    canonical = parse_task(normalize_modification(text), "HackAtari", "ALE/Freeway-v5")
    # one tokenisation: every parse shares its tokens, the canonical form included
    assert tasks[0].tokens is tasks[1].tokens is canonical.tokens
    assert modstrings._parse(" ".join(["b", "a_string_nobody_parsed"])).tokens == tasks[0].tokens


def test_the_places_that_normalise_agree():
    assert ceval.parse_eval_modifs("b a; ;a b") == ["a b", ""]
    assert vector.regime_slug("b a") == vector.regime_slug("a b")


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("", ""),
        ("   ", ""),
        ("a", "a"),
        ("b a", "a b"),
        ("  b   a  ", "a b"),
        ("a a b a", "a b"),
        ("all_blue_cars ", "all_blue_cars"),
        ("\tx\ny ", "x y"),
        (["b", "", "a"], "a b"),
        (["reverse_car_speed_top", "all_green_cars"], "all_green_cars reverse_car_speed_top"),
        ("length=0.7 gravity=12.0", "gravity=12.0 length=0.7"),
        ([], ""),
    ],
)
def test_normalize_modification(raw: Any, expected: str) -> None:
    assert normalize_modification(raw) == expected


# ---------------------------------------------------------------------------------------------------------------------
# Tasks are parsed once: the same results and one-line errors as the code before (a pinned table, and 2,000 random
# strings against a frozen copy of the old tokenizer)
# ---------------------------------------------------------------------------------------------------------------------


def run_case(kind: str, args: tuple) -> tuple:
    """The library's entry point for each kind of case: ("ok", result) or ("error", type name, message)."""
    from continual.curricula.tasks import TaskSequenceModificationFactory, task_string

    calls = {
        "canon": normalize_modification, "tokens": modification_tokens,
        "split": lambda s: (parse_task(s).env, parse_task(s).modification),
        "env_ids": lambda env_id, strings: task_env_ids(parse_tasks(strings, env_id=env_id)),
        "game": game_name, "eval": ceval.parse_eval_modifs, "env": backends.validate_env_id,
        "valid": lambda backend, env_id, s: backends.validate_task(parse_task(s, backend, env_id)),
        "minatar": lambda env_id, s: backends.minatar_parameters(parse_task(s, "MinAtar", env_id)),
        "gym": lambda env_id, s: backends.gym_parameter_values(parse_task(s, "Gymnasium", env_id)),
        "avail": lambda *a: list(backends.available_modifications(*a)), "task_string": task_string,
        "taskseq": lambda tasks: TaskSequenceModificationFactory(tasks=tasks).possible_modifications(),
    }
    try:
        return ("ok", calls[kind](*args))
    except Exception as e:  # noqa: BLE001 - the type and message are what is compared
        return ("error", type(e).__name__, str(e))


# Modifications registered after the pin (da56a98): the pinned outcomes list the names there were then, so these
# checks run without them (the parsing and validation they pin did not change; the names are tested where they live).
ADDED_SINCE_PIN = {"freeway": ("stop_random_car_develop", "vary_car_speeds_fixed")}


@pytest.fixture
def names_of_the_pin(monkeypatch):
    from continual.envs.modifications.registry import REGISTRY

    for game, names in ADDED_SINCE_PIN.items():
        monkeypatch.setitem(REGISTRY, game, {n: m for n, m in REGISTRY[game].items() if n not in names})


@pytest.mark.parametrize("kind, args, expected", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_pinned_table(kind: str, args: tuple, expected: tuple, names_of_the_pin) -> None:
    assert run_case(kind, args) == expected


RANDOM_POOL = ("a", "b", "all_green_cars", "stop_all_cars", "zzz", "sticky_action_prob=0.2", "sticky_action_prob=2",
               "sticky_action_prob=0.5", "permute_obs=3", "difficulty_ramping=0", "gravity=12", "gravity=3",
               "length=0.7", "gravity=x", "env=MinAtar/Freeway", "env=MinAtar/Breakout", "env=", "env=CartPole-v1",
               "env=ALE/Pong-v5", "x=1=2", "=3", "tau=inf", "no_reward_cutoff=1000", "lazy_enemy")
RANDOM_GAMES = (("MinAtar", "MinAtar/Breakout"), ("Gymnasium", "CartPole-v1"), ("HackAtari", "ALE/Freeway-v5"),
                ("OCAtari", "ALE/Pong-v5"))
# sha256 of every (string, backend) validation outcome below, recorded from the code at da56a98
RANDOM_VALIDATION_DIGEST = "c765bcfab217b018469a29d999cb2c84ee055baa2a8e7568559861d4a45a03e6"


def random_strings(n: int = 2000, seed: int = 50) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tokens = [rng.choice(RANDOM_POOL) for _ in range(rng.randint(0, 5))]
        seps = [rng.choice((" ", "  ", "\t", "\n ")) for _ in tokens]
        out.append(rng.choice(("", " ", "\t")) + "".join(t + s for t, s in zip(tokens, seps)).rstrip(
            "" if rng.random() < 0.5 else " \t\n"))
    return out


def _outcome(fn, *args) -> tuple:
    try:
        return ("ok", fn(*args))
    except (UserError, reference.ReferenceError_) as e:
        return ("error", str(e))


def test_random_strings_parse_as_the_old_tokenizer() -> None:
    strings = random_strings()
    assert len(set(strings)) > 1000
    for s in strings:
        assert normalize_modification(s) == reference.normalize_modification(s)
        assert modification_tokens(s) == reference.modification_tokens(s)
        assert _outcome(lambda: (parse_task(s).env, parse_task(s).modification)) == _outcome(reference.split_task, s)
        assert _outcome(lambda: task_env_ids(parse_tasks([s, "a"], env_id="MinAtar/Asterix"))) == _outcome(
            reference.task_env_ids, "MinAtar/Asterix", [s, "a"])
        if _outcome(reference.split_task, s)[0] == "ok":  # the parameters the MinAtar and Gymnasium parsers read
            assert [(n, v if sep else None) for n, sep, v in reference.parameters(reference.split_task(s)[1])] == list(
                parse_task(s).parameters)
    for i in range(0, len(strings), 7):
        text = ";".join(strings[i:i + 7])
        assert ceval.parse_eval_modifs(text) == reference.parse_eval_modifs(text)


def test_random_strings_validate_as_before(names_of_the_pin) -> None:
    digest = hashlib.sha256()
    for s in random_strings():
        for backend, env_id in RANDOM_GAMES:
            outcome = _outcome(lambda: backends.validate_task(parse_task(s, backend, env_id)))
            digest.update(repr((s, backend, outcome)).encode())
    assert digest.hexdigest() == RANDOM_VALIDATION_DIGEST
