"""continual.modstrings: the one canonical form of modification strings, used by envs, curricula, evaluation and
metrics (they had three copies; the env-side one refused lists, the curriculum one accepted them)."""

from __future__ import annotations

from typing import Any

import pytest

import continual.curricula as curricula
import continual.envs.backends as backends
import continual.envs.vector as vector
import continual.evaluation.continual as ceval
import continual.evaluation.metrics as metrics
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
