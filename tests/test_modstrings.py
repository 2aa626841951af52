"""continual.modstrings: the one canonical form of modification strings, used by envs, curricula, evaluation and
metrics (they had three copies; the env-side one refused lists, the curriculum one accepted them)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import modstrings_reference as reference
import pytest
from modstrings_cases import CASES

import continual.curricula as curricula
import continual.envs.backends as backends
import continual.envs.vector as vector
import continual.evaluation.continual as ceval
import continual.evaluation.metrics as metrics
from continual.errors import UserError
from continual.modstrings import modification_tokens, normalize_modification


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
    for module in (backends, vector, ceval, metrics):
        assert module.normalize_modification is normalize_modification
        assert not hasattr(module, "normalize")


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
        "split": backends.split_task, "env_ids": backends.task_env_ids, "game": backends.game_name,
        "eval": ceval.parse_eval_modifs, "env": backends.validate_env_id, "valid": backends.validate_modification,
        "minatar": backends.parse_minatar_tokens, "gym": backends.parse_parameter_tokens,
        "avail": lambda *a: list(backends.available_modifications(*a)), "task_string": task_string,
        "taskseq": lambda tasks: TaskSequenceModificationFactory(tasks=tasks).possible_modifications(),
    }
    try:
        return ("ok", calls[kind](*args))
    except Exception as e:  # noqa: BLE001 - the type and message are what is compared
        return ("error", type(e).__name__, str(e))


@pytest.mark.parametrize("kind, args, expected", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_pinned_table(kind: str, args: tuple, expected: tuple) -> None:
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
        assert _outcome(backends.split_task, s) == _outcome(reference.split_task, s)
        assert _outcome(backends.task_env_ids, "MinAtar/Asterix", [s, "a"]) == _outcome(
            reference.task_env_ids, "MinAtar/Asterix", [s, "a"])
    for i in range(0, len(strings), 7):
        text = ";".join(strings[i:i + 7])
        assert ceval.parse_eval_modifs(text) == reference.parse_eval_modifs(text)


def test_random_strings_validate_as_before() -> None:
    digest = hashlib.sha256()
    for s in random_strings():
        for backend, env_id in RANDOM_GAMES:
            outcome = _outcome(backends.validate_modification, backend, env_id, s)
            digest.update(repr((s, backend, outcome)).encode())
    assert digest.hexdigest() == RANDOM_VALIDATION_DIGEST
