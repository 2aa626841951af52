"""Tests for modification_factories.py (schedules, randomness, validation, registry, CLI)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import modification_factories as mf  # noqa: E402
from modification_factories import (  # noqa: E402
    FACTORIES,
    FactoryConfigError,
    ModificationFactory,
    make_factory,
    normalize_modification,
    register_factory,
)

README_CONFIG: dict[str, Any] = {
    "modification_factory": "EpsCombinedModificationFactory",
    "modification_factory_kwargs": {
        "epsilon": 0.005,
        "modification_factory_kwargs": {
            "SequentialModificationFactory": {
                "num_total_steps": 1000,
                "modifications": ["disable_cars"],
                "switching_thresholds": [],
            },
            "AllCombinationsRandomModificationFactory": {
                "num_total_steps": 1000,
                "modifications": [
                    ["all_green_cars", "all_pink_cars", "all_white_cars", "all_blue_cars"],
                    ["", "reverse_car_speed_bottom", "reverse_car_speed_top"],
                ],
                "num_repetitions": 20,
            },
        },
    },
}


def seq(name: str, **kwargs: Any) -> dict[str, Any]:
    """A phase in list form."""
    return {"modification_factory": name, "modification_factory_kwargs": kwargs}


def every_step(factory: ModificationFactory) -> list[str]:
    return [factory.get_modification(s) for s in range(factory.total_timesteps)]


def expand(schedule: list[tuple[int, int, str]]) -> list[str]:
    out: list[str] = []
    for start, end, mod in schedule:
        assert end > start
        out.extend([mod] * (end - start))
    return out


def decisions(factory: ModificationFactory) -> list[str]:
    g = factory.granularity
    return [factory.get_modification(s) for s in range(0, factory.total_timesteps, g)]


def run_lengths(values: list[str]) -> list[int]:
    lengths: list[int] = []
    for i, v in enumerate(values):
        if i and v == values[i - 1]:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return lengths


def is_normalized(s: str) -> bool:
    return s == " ".join(sorted(set(s.split())))


# --------------------------------------------------------------------------- #
# Normalisation
# --------------------------------------------------------------------------- #
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


# --------------------------------------------------------------------------- #
# Deterministic schedules (hand computed)
# --------------------------------------------------------------------------- #
SCHEDULE_CASES: list[tuple[str, str, dict[str, Any], int, list[tuple[int, int, str]]]] = [
    ("none", "NoModificationFactory", {"num_total_steps": 7}, 1, [(0, 7, "")]),
    ("none_g3", "No", {"num_total_steps": 7}, 3, [(0, 7, "")]),
    (
        "seq_g1",
        "Sequential",
        {"num_total_steps": 10, "modifications": ["a", "b", "c"], "switching_thresholds": [3, 7]},
        1,
        [(0, 3, "a"), (3, 7, "b"), (7, 10, "c")],
    ),
    (
        "seq_quantised",  # thresholds 3 and 7 switch at the next boundaries 4 and 8
        "Sequential",
        {"num_total_steps": 10, "modifications": ["a", "b", "c"], "switching_thresholds": [3, 7]},
        4,
        [(0, 4, "a"), (4, 8, "b"), (8, 10, "c")],
    ),
    (
        "seq_threshold_on_boundary",  # >= : step 4 already belongs to "b"
        "Sequential",
        {"num_total_steps": 12, "modifications": ["a", "b", "c"], "switching_thresholds": [4, 8]},
        4,
        [(0, 4, "a"), (4, 8, "b"), (8, 12, "c")],
    ),
    (
        "seq_entry_shorter_than_decision",  # "b" covers [1, 2) which holds no decision start
        "Sequential",
        {"num_total_steps": 10, "modifications": ["a", "b", "c"], "switching_thresholds": [1, 2]},
        4,
        [(0, 4, "a"), (4, 10, "c")],
    ),
    (
        "seq_single",
        "SequentialModificationFactory",
        {"num_total_steps": 5, "modifications": ["disable_cars"], "switching_thresholds": []},
        2,
        [(0, 5, "disable_cars")],
    ),
    (
        "seq_normalises_and_merges",
        "Sequential",
        {"num_total_steps": 6, "modifications": [" b  a", "a b b", "c "], "switching_thresholds": [2, 4]},
        1,
        [(0, 4, "a b"), (4, 6, "c")],
    ),
    (
        "seq_float_steps",
        "Sequential",
        {"num_total_steps": 6.0, "modifications": ["a", "b"], "switching_thresholds": [3.0]},
        1,
        [(0, 3, "a"), (3, 6, "b")],
    ),
    (
        "combined_dict_three_phases",
        "Combined",
        {
            "modification_factory_kwargs": {
                "Sequential": {"num_total_steps": 5, "modifications": ["a"], "switching_thresholds": []},
                "NoModification": {"num_total_steps": 3},
                "Random": {"num_total_steps": 4, "modifications": ["c"]},
            }
        },
        1,
        [(0, 5, "a"), (5, 8, ""), (8, 12, "c")],
    ),
    (
        "combined_phase_shorter_than_decision",  # phase 1 = [5, 8) holds no multiple of 4
        "Combined",
        {
            "modification_factory_kwargs": {
                "Sequential": {"num_total_steps": 5, "modifications": ["a"], "switching_thresholds": []},
                "NoModification": {"num_total_steps": 3},
                "Random": {"num_total_steps": 4, "modifications": ["c"]},
            }
        },
        4,
        [(0, 8, "a"), (8, 12, "c")],
    ),
    (
        "combined_phase_ends_on_boundaries",  # every phase ends exactly on a decision boundary
        "Combined",
        {
            "modification_factory_kwargs": [
                seq("Sequential", num_total_steps=4, modifications=["a"], switching_thresholds=[]),
                seq("Sequential", num_total_steps=4, modifications=["b"], switching_thresholds=[]),
                seq("Sequential", num_total_steps=8, modifications=["x", "y"], switching_thresholds=[4]),
            ]
        },
        4,
        [(0, 4, "a"), (4, 8, "b"), (8, 12, "x"), (12, 16, "y")],
    ),
    (
        "combined_no_double_subtraction",
        "Combined",
        {
            "modification_factory_kwargs": [
                seq("Sequential", num_total_steps=6, modifications=["a"], switching_thresholds=[]),
                seq("Sequential", num_total_steps=6, modifications=["b", "c"], switching_thresholds=[3]),
                seq("Sequential", num_total_steps=6, modifications=["d", "e"], switching_thresholds=[3]),
                seq("Sequential", num_total_steps=6, modifications=["f", "g"], switching_thresholds=[3]),
            ]
        },
        1,
        [(0, 6, "a"), (6, 9, "b"), (9, 12, "c"), (12, 15, "d"), (15, 18, "e"), (18, 21, "f"), (21, 24, "g")],
    ),
    (
        "combined_lengths_not_multiple_of_g",
        # decisions 0,3,6,9: phase0 local 0,3 -> a,b ; phase1 local 1,4 -> c,d
        "Combined",
        {
            "modification_factory_kwargs": [
                seq("Sequential", num_total_steps=5, modifications=["a", "b"], switching_thresholds=[2]),
                seq("Sequential", num_total_steps=7, modifications=["c", "d"], switching_thresholds=[3]),
            ]
        },
        3,
        [(0, 3, "a"), (3, 6, "b"), (6, 9, "c"), (9, 12, "d")],
    ),
    (
        "combined_nested",
        "Combined",
        {
            "modification_factory_kwargs": [
                seq("NoModification", num_total_steps=2),
                seq(
                    "Combined",
                    modification_factory_kwargs={
                        "Sequential": {"num_total_steps": 3, "modifications": ["p", "q"], "switching_thresholds": [1]},
                        "Random": {"num_total_steps": 2, "modifications": ["r"]},
                    },
                ),
                seq("Sequential", num_total_steps=2, modifications=["z y"], switching_thresholds=[]),
            ]
        },
        1,
        [(0, 2, ""), (2, 3, "p"), (3, 5, "q"), (5, 7, "r"), (7, 9, "y z")],
    ),
    (
        "eps_sequential_eps0",
        "EpsSequential",
        {"num_total_steps": 10, "modifications": ["a", "b", "c"], "switching_thresholds": [3, 7], "epsilon": 0},
        2,
        [(0, 4, "a"), (4, 8, "b"), (8, 10, "c")],
    ),
    (
        "all_combinations_one_hot",  # product order: x, "q x", y, "q y"
        "AllCombinationsRandom",
        {"num_total_steps": 9, "modifications": [["x", "y"], ["", "q"]], "probabilities": [0, 1, 0, 0]},
        2,
        [(0, 9, "q x")],
    ),
    (
        "random_one_hot_first",
        "Random",
        {"num_total_steps": 9, "modifications": ["a", "b"], "probabilities": [1, 0]},
        1,
        [(0, 9, "a")],
    ),
    (
        "random_one_hot_last",
        "Random",
        {"num_total_steps": 9, "modifications": ["a", "b", "c"], "probabilities": [0.0, 0.0, 1.0]},
        1,
        [(0, 9, "c")],
    ),
]


@pytest.mark.parametrize("name, kwargs, g, expected", [c[1:] for c in SCHEDULE_CASES], ids=[c[0] for c in SCHEDULE_CASES])
def test_schedule_hand_computed(name: str, kwargs: dict[str, Any], g: int, expected: list[tuple[int, int, str]]) -> None:
    factory = make_factory(name, kwargs, seed=5, granularity=g)
    assert factory.schedule() == expected
    # Step by step, through the scalar path on a fresh instance.
    fresh = make_factory(name, kwargs, seed=5, granularity=g)
    assert every_step(fresh) == expand(expected)
    assert fresh.total_timesteps == expected[-1][1]


def test_phase_change_exact_boundary_steps() -> None:
    # Phase ends at 1024 = one decision; step 1024 must already be in phase 1 and not assert.
    f = make_factory(
        "Combined",
        {
            "modification_factory_kwargs": [
                seq("Sequential", num_total_steps=1024, modifications=["a"], switching_thresholds=[]),
                seq("Sequential", num_total_steps=2048, modifications=["b", "c"], switching_thresholds=[1024]),
                seq("Sequential", num_total_steps=1024, modifications=["d"], switching_thresholds=[]),
            ]
        },
        granularity=1024,
    )
    steps = (0, 1023, 1024, 2047, 2048, 3071, 3072, 4095)
    assert [f.get_modification(s) for s in steps] == ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert f.schedule() == [(0, 1024, "a"), (1024, 2048, "b"), (2048, 3072, "c"), (3072, 4096, "d")]


def test_combined_same_class_twice_in_list_form_and_dict_equivalence() -> None:
    phases = [
        seq("Sequential", num_total_steps=3, modifications=["a"], switching_thresholds=[]),
        seq("Sequential", num_total_steps=3, modifications=["b"], switching_thresholds=[]),
        seq("SequentialModificationFactory", num_total_steps=3, modifications=["a"], switching_thresholds=[]),
    ]
    f = make_factory("Combined", {"modification_factory_kwargs": phases})
    assert every_step(f) == list("aaabbbaaa")
    as_dict = make_factory(
        "Combined",
        {
            "modification_factory_kwargs": {
                "Sequential": {"num_total_steps": 3, "modifications": ["a"], "switching_thresholds": []},
                "Random": {"num_total_steps": 3, "modifications": ["b"]},
            }
        },
    )
    assert as_dict.schedule() == [(0, 3, "a"), (3, 6, "b")]


@pytest.mark.parametrize("step", [-1, 10, 11, 10**9])
def test_out_of_range_step_raises(step: int) -> None:
    f = make_factory("Sequential", {"num_total_steps": 10, "modifications": ["a"], "switching_thresholds": []})
    with pytest.raises(ValueError, match=rf"step {step}.*\[0, 10\)"):
        f.get_modification(step)


def test_non_int_step_raises_type_error() -> None:
    f = make_factory("NoModification", {"num_total_steps": 10})
    with pytest.raises(TypeError):
        f.get_modification(True)
    with pytest.raises(TypeError):
        f.get_modification(1.0)
    assert f.get_modification(np.int64(3)) == ""


# --------------------------------------------------------------------------- #
# Random factories
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("seed", range(20))
def test_random_first_block_respects_probabilities(seed: int) -> None:
    f = make_factory("Random", {"num_total_steps": 50, "modifications": ["a", "b"], "probabilities": [1, 0]}, seed=seed)
    assert set(every_step(f)) == {"a"}
    g = make_factory("Random", {"num_total_steps": 50, "modifications": ["a", "b"], "probabilities": [0, 1]}, seed=seed)
    assert g.get_modification(0) == "b"
    assert set(every_step(g)) == {"b"}


@pytest.mark.parametrize("reps, g", [(1, 1), (3, 1), (4, 5), (20, 2)])
def test_random_holds_exactly_num_repetitions_decisions(reps: int, g: int) -> None:
    mods = [f"m{i}" for i in range(40)]
    n_decisions = 400 * reps
    f = make_factory(
        "Random",
        {"num_total_steps": n_decisions * g, "modifications": mods, "num_repetitions": reps},
        seed=11,
        granularity=g,
    )
    values = decisions(f)
    # Constant within each block of `reps` decisions.
    for d, v in enumerate(values):
        assert v == values[d - d % reps]
    lengths = run_lengths(values)
    assert all(length % reps == 0 for length in lengths)
    # Neighbouring blocks usually differ (40 choices), so most runs are exactly `reps` long.
    assert Counter(lengths)[reps] > 0.9 * len(lengths)
    # Schedule agrees: every run a multiple of reps * g steps (except a truncated last one).
    for start, end, _ in f.schedule()[:-1]:
        assert (end - start) % (reps * g) == 0


def test_random_num_repetitions_truncated_by_end() -> None:
    f = make_factory("Random", {"num_total_steps": 7, "modifications": ["a"], "num_repetitions": 5}, granularity=2)
    assert f.schedule() == [(0, 7, "a")]


@pytest.mark.parametrize(
    "mods, probs, expected",
    [
        (["a", "b", "c"], [0.2, 0.5, 0.3], {"a": 0.2, "b": 0.5, "c": 0.3}),
        (["a", "b", "c", "d"], None, {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}),
        (["a", "a", "b"], None, {"a": 2 / 3, "b": 1 / 3}),
        (["a", "b", "c"], [0.0, 0.9, 0.1], {"b": 0.9, "c": 0.1}),
    ],
)
def test_random_empirical_frequencies(mods: list[str], probs: list[float] | None, expected: dict[str, float]) -> None:
    n = 20000
    f = make_factory("Random", {"num_total_steps": n, "modifications": mods, "probabilities": probs}, seed=2)
    counts = Counter(expand(f.schedule()))
    assert set(counts) == set(expected)
    for mod, p in expected.items():
        assert abs(counts[mod] / n - p) < 0.02


def test_all_combinations_product_and_normalisation() -> None:
    kwargs = {
        "num_total_steps": 4000,
        "modifications": [["all_green_cars", "all_blue_cars"], ["", "reverse_car_speed_top", ""]],
    }
    f = make_factory("AllCombinationsRandom", kwargs, seed=4)
    expected = [
        "all_blue_cars",
        "all_blue_cars reverse_car_speed_top",
        "all_green_cars",
        "all_green_cars reverse_car_speed_top",
    ]
    assert f.possible_modifications() == expected
    values = every_step(f)
    assert set(values) == set(expected)
    assert all(is_normalized(v) and "  " not in v and not v.endswith(" ") for v in values)


@pytest.mark.parametrize(
    "probs, expected",
    [
        ([1, 0, 0, 0], "x"),
        ([0, 1, 0, 0], "q x"),
        ([0, 0, 1, 0], "y"),
        ([0, 0, 0, 1], "q y"),
    ],
)
def test_all_combinations_probabilities_follow_product_order(probs: list[float], expected: str) -> None:
    f = make_factory(
        "AllCombinationsRandomModificationFactory",
        {"num_total_steps": 30, "modifications": [["x", "y"], ["", "q"]], "probabilities": probs},
        seed=9,
    )
    assert set(every_step(f)) == {expected}
    assert f.possible_modifications() == [expected]


# --------------------------------------------------------------------------- #
# Epsilon factories
# --------------------------------------------------------------------------- #
SEQ3 = {"num_total_steps": 3000, "modifications": ["a", "b", "c"], "switching_thresholds": [1000, 2000]}


@pytest.mark.parametrize("g", [1, 7])
def test_eps_sequential_epsilon_zero_equals_sequential(g: int) -> None:
    base = make_factory("Sequential", SEQ3, seed=3, granularity=g)
    eps = make_factory("EpsSequential", {**SEQ3, "epsilon": 0.0}, seed=3, granularity=g)
    assert every_step(eps) == every_step(base)


def test_eps_sequential_epsilon_one() -> None:
    f = make_factory("EpsSequential", {**SEQ3, "epsilon": 1.0}, seed=3)
    values = every_step(f)
    assert set(values[:1000]) == {"a"}  # first entry never replays
    assert set(values[1000:2000]) == {"a"}  # only earlier entry of "b"
    assert set(values[2000:]) == {"a", "b"}  # uniformly among earlier entries
    assert abs(values[2000:].count("a") / 1000 - 0.5) < 0.1
    assert f.possible_modifications() == ["a", "b"]


def test_eps_sequential_replays_only_earlier_entries_at_rate_epsilon() -> None:
    f = make_factory("EpsSequential", {**SEQ3, "epsilon": 0.3}, seed=8, granularity=2)
    values = every_step(f)
    assert set(values[:1000]) == {"a"}
    assert set(values[1000:2000]) <= {"a", "b"}
    assert set(values[2000:]) <= {"a", "b", "c"}
    per_decision = values[2000::2]
    replay_rate = sum(v != "c" for v in per_decision) / len(per_decision)
    assert abs(replay_rate - 0.3) < 0.07
    # A replay lasts exactly one decision: both steps of a decision agree.
    assert all(values[s] == values[s + 1] for s in range(0, 3000, 2))


def test_eps_sequential_differs_from_sequential_for_positive_epsilon() -> None:
    base = make_factory("Sequential", SEQ3)
    eps = make_factory("EpsSequential", {**SEQ3, "epsilon": 0.1})
    assert every_step(eps) != every_step(base)
    assert eps.possible_modifications() == ["a", "b", "c"]


EPS_PHASES = [
    seq("Random", num_total_steps=400, modifications=[f"r{i}" for i in range(10)], num_repetitions=100),
    seq("Sequential", num_total_steps=300, modifications=["s"], switching_thresholds=[]),
    seq("NoModification", num_total_steps=300),
]


@pytest.mark.parametrize("g", [1, 3])
def test_eps_combined_epsilon_zero_equals_combined(g: int) -> None:
    base = make_factory("Combined", {"modification_factory_kwargs": EPS_PHASES}, seed=6, granularity=g)
    eps = make_factory("EpsCombined", {"modification_factory_kwargs": EPS_PHASES, "epsilon": 0}, seed=6, granularity=g)
    assert every_step(eps) == every_step(base)


def test_eps_combined_replays_only_actually_emitted_strings() -> None:
    base = make_factory("Combined", {"modification_factory_kwargs": EPS_PHASES}, seed=6)
    f = make_factory("EpsCombined", {"modification_factory_kwargs": EPS_PHASES, "epsilon": 1.0}, seed=6)
    base_values = every_step(base)
    emitted_phase0 = set(base_values[:400])
    assert 1 <= len(emitted_phase0) <= 4  # 4 blocks of 100 steps: only a few of the 10 strings
    values = every_step(f)
    assert values[:400] == base_values[:400]  # phase 0 never replays
    assert set(values[400:700]) == emitted_phase0  # all replays, all from phase 0's actual output
    assert set(values[700:]) == emitted_phase0 | {"s"}
    assert f.replay_pools() == [[], sorted(emitted_phase0), sorted(emitted_phase0 | {"s"})]


def test_eps_combined_rate_and_pool_after_no_modification_phase() -> None:
    phases = [
        seq("NoModification", num_total_steps=100),
        seq("AllCombinationsRandom", num_total_steps=100, modifications=[["a", "b"], ["", "c"]]),
        seq("Sequential", num_total_steps=4000, modifications=["z"], switching_thresholds=[]),
    ]
    f = make_factory("EpsCombined", {"modification_factory_kwargs": phases, "epsilon": 0.25}, seed=1)
    values = every_step(f)
    assert set(values[:100]) == {""}
    emitted_before_2 = set(values[:200]) - {"z"}
    tail = values[200:]
    assert set(tail) <= emitted_before_2 | {"z"}
    assert abs(sum(v != "z" for v in tail) / len(tail) - 0.25) < 0.03
    pools = f.replay_pools()
    assert pools[1] == [""]
    assert all(isinstance(s, str) and is_normalized(s) for s in pools[2])


def test_eps_combined_epsilon_one_in_phase_zero_and_empty_pool_never_crash() -> None:
    phases = [
        seq("Sequential", num_total_steps=3, modifications=["tiny"], switching_thresholds=[]),
        seq("Random", num_total_steps=20, modifications=["x", "y"]),
    ]
    # granularity 4: phase 0 = [0, 3) holds decision 0 only; pool of phase 1 = {"tiny"}.
    f = make_factory("EpsCombined", {"modification_factory_kwargs": phases, "epsilon": 1}, granularity=4)
    assert every_step(f) == ["tiny"] * 23
    # A single-phase EpsCombined with epsilon 1 has nothing to replay.
    single = make_factory("EpsCombined", {"modification_factory_kwargs": phases[1:], "epsilon": 1.0}, seed=2)
    assert set(every_step(single)) <= {"x", "y"}
    # Nested at an offset so that its phase 0 holds no decision start: empty pool, no replay.
    inner = {"modification_factory_kwargs": [seq("NoModification", num_total_steps=2), phases[1]], "epsilon": 1.0}
    outer = make_factory(
        "Combined",
        {"modification_factory_kwargs": [seq("Sequential", num_total_steps=1, modifications=["o"], switching_thresholds=[]), seq("EpsCombined", **inner)]},
        granularity=4,
        seed=2,
    )
    eps_inner = outer.phases[1]
    assert eps_inner.replay_pools(offset=3) == [[], []]
    assert eps_inner.replay_pools(offset=0) == [[], [""]]
    values = every_step(outer)
    assert values[:4] == ["o"] * 4
    assert set(values[4:]) <= {"x", "y"}


@pytest.mark.parametrize("g", [1, 20, 1024])
def test_readme_example_config(g: int) -> None:
    kwargs = README_CONFIG["modification_factory_kwargs"]
    f = make_factory(README_CONFIG["modification_factory"], kwargs, seed=1, granularity=g)
    assert f.total_timesteps == 2000
    possible = set(f.possible_modifications())
    assert len(possible) == 13
    values = every_step(f)
    assert set(values[:1000]) == {"disable_cars"}  # phase 0 never replays
    for v in values:
        assert isinstance(v, str) and is_normalized(v) and v in possible
        assert "  " not in v and not v.endswith(" ")
    assert expand(f.schedule()) == values


# --------------------------------------------------------------------------- #
# Determinism, purity, RNG isolation
# --------------------------------------------------------------------------- #
RANDOM_FACTORIES: list[tuple[str, dict[str, Any]]] = [
    ("Random", {"num_total_steps": 500, "modifications": ["a", "b", "c", "d"], "num_repetitions": 2}),
    ("AllCombinationsRandom", {"num_total_steps": 500, "modifications": [["a", "b"], ["", "c", "d"]]}),
    ("EpsSequential", {"num_total_steps": 500, "modifications": ["a", "b", "c"], "switching_thresholds": [50, 100], "epsilon": 0.5}),
    ("EpsCombined", {"modification_factory_kwargs": EPS_PHASES, "epsilon": 0.3}),
    ("Combined", {"modification_factory_kwargs": EPS_PHASES}),
]


@pytest.mark.parametrize("name, kwargs", RANDOM_FACTORIES, ids=[r[0] for r in RANDOM_FACTORIES])
def test_same_seed_same_schedule_different_seed_differs(name: str, kwargs: dict[str, Any]) -> None:
    a = every_step(make_factory(name, kwargs, seed=7, granularity=3))
    b = every_step(make_factory(name, kwargs, seed=7, granularity=3))
    c = every_step(make_factory(name, kwargs, seed=8, granularity=3))
    assert a == b
    assert a != c


@pytest.mark.parametrize("name, kwargs", RANDOM_FACTORIES, ids=[r[0] for r in RANDOM_FACTORIES])
def test_global_rng_state_untouched(name: str, kwargs: dict[str, Any]) -> None:
    np.random.seed(123)
    random.seed(123)
    expected_np, expected_py = np.random.random(), random.random()
    np.random.seed(123)
    random.seed(123)
    f = make_factory(name, kwargs, seed=1)
    every_step(f)
    f.schedule()
    f.possible_modifications()
    assert np.random.random() == expected_np
    assert random.random() == expected_py


@pytest.mark.parametrize("name, kwargs", RANDOM_FACTORIES + [(c[1], c[2]) for c in SCHEDULE_CASES[:6]])
def test_pure_function_any_call_order(name: str, kwargs: dict[str, Any]) -> None:
    reference = every_step(make_factory(name, kwargs, seed=4, granularity=2))
    f = make_factory(name, kwargs, seed=4, granularity=2)
    order = list(range(f.total_timesteps))
    random.Random(0).shuffle(order)
    shuffled = {s: f.get_modification(s) for s in order}
    assert [shuffled[s] for s in range(f.total_timesteps)] == reference
    # Skipping steps (sparse, backwards) and asking twice gives the same answers.
    g = make_factory(name, kwargs, seed=4, granularity=2)
    for s in list(range(f.total_timesteps - 1, -1, -37)) * 2:
        assert g.get_modification(s) == reference[s]
    # The vectorised schedule agrees with the scalar path.
    assert expand(make_factory(name, kwargs, seed=4, granularity=2).schedule()) == reference


def test_random_chunk_boundaries_are_pure() -> None:
    # Far beyond one lazily generated random chunk; sparse access equals the schedule.
    n = 300_000
    f = make_factory("Random", {"num_total_steps": n, "modifications": [str(i) for i in range(30)]}, seed=3)
    values = expand(f.schedule())
    g = make_factory("Random", {"num_total_steps": n, "modifications": [str(i) for i in range(30)]}, seed=3)
    for s in random.Random(1).sample(range(n), 2000):
        assert g.get_modification(s) == values[s]


def test_schedule_with_other_granularity() -> None:
    f = make_factory("Sequential", {"num_total_steps": 10, "modifications": ["a", "b"], "switching_thresholds": [3]})
    assert f.schedule(granularity=4) == [(0, 4, "a"), (4, 10, "b")]
    assert f.schedule() == [(0, 3, "a"), (3, 10, "b")]
    with pytest.raises(FactoryConfigError, match="granularity"):
        f.schedule(granularity=0)


def test_large_curriculum_constructs_quickly() -> None:
    kwargs = {
        "modification_factory_kwargs": [
            seq("EpsSequential", num_total_steps=5e6, modifications=["a", "b", "c"], switching_thresholds=[1e6, 3e6]),
            seq("Random", num_total_steps=5e6, modifications=["x", "y", "z"], num_repetitions=3),
        ],
        "epsilon": 0.05,
    }
    t0 = time.perf_counter()
    f = make_factory("EpsCombined", kwargs, seed=1, granularity=1024)
    assert time.perf_counter() - t0 < 0.5
    assert f.total_timesteps == 10_000_000
    t0 = time.perf_counter()
    runs = f.schedule()
    assert time.perf_counter() - t0 < 2.0
    assert runs[0][0] == 0 and runs[-1][1] == 10_000_000
    t0 = time.perf_counter()
    fine = make_factory("EpsCombined", kwargs, seed=1, granularity=1)
    fine.get_modification(9_999_999)
    assert time.perf_counter() - t0 < 3.0


# --------------------------------------------------------------------------- #
# possible_modifications
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "name, kwargs, g, expected",
    [
        ("NoModification", {"num_total_steps": 3}, 1, [""]),
        ("Sequential", {"num_total_steps": 10, "modifications": ["b", "a", "b"], "switching_thresholds": [3, 6]}, 1, ["a", "b"]),
        ("Sequential", {"num_total_steps": 10, "modifications": ["a", "b", "c"], "switching_thresholds": [1, 2]}, 4, ["a", "c"]),
        ("EpsSequential", {"num_total_steps": 10, "modifications": ["a", "b", "c"], "switching_thresholds": [1, 2], "epsilon": 0.5}, 4, ["a", "b", "c"]),
        ("EpsSequential", {"num_total_steps": 10, "modifications": ["a", "b"], "switching_thresholds": [5], "epsilon": 0.0}, 1, ["a", "b"]),
        ("Random", {"num_total_steps": 10, "modifications": ["x", "y y", "z"], "probabilities": [0.5, 0.5, 0]}, 1, ["x", "y"]),
        ("AllCombinationsRandom", {"num_total_steps": 10, "modifications": [["", "q"], ["", "p"]]}, 1, ["", "p", "p q", "q"]),
        (
            "Combined",
            {
                "modification_factory_kwargs": [
                    seq("Sequential", num_total_steps=5, modifications=["a"], switching_thresholds=[]),
                    seq("NoModification", num_total_steps=3),
                    seq("Random", num_total_steps=4, modifications=["c", "d"]),
                ]
            },
            4,
            ["a", "c", "d"],
        ),
        (
            "EpsCombined",
            {
                "modification_factory_kwargs": [
                    seq("Sequential", num_total_steps=5, modifications=["a"], switching_thresholds=[]),
                    seq("Sequential", num_total_steps=5, modifications=["b"], switching_thresholds=[]),
                ],
                "epsilon": 1.0,
            },
            1,
            ["a"],
        ),
    ],
)
def test_possible_modifications(name: str, kwargs: dict[str, Any], g: int, expected: list[str]) -> None:
    f = make_factory(name, kwargs, granularity=g)
    assert f.possible_modifications() == expected
    assert set(every_step(f)) <= set(expected)


# --------------------------------------------------------------------------- #
# state_dict
# --------------------------------------------------------------------------- #
STATE_CASES = RANDOM_FACTORIES + [
    ("NoModification", {"num_total_steps": 10}),
    ("Sequential", {"num_total_steps": 10, "modifications": ["a", "b"], "switching_thresholds": [4]}),
    ("EpsCombined", README_CONFIG["modification_factory_kwargs"]),
]


@pytest.mark.parametrize("name, kwargs", STATE_CASES, ids=[c[0] for c in STATE_CASES])
def test_state_dict_round_trip_continues_identically(name: str, kwargs: dict[str, Any], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    old = make_factory(name, kwargs, seed=13, granularity=2)
    first_half = [old.get_modification(s) for s in range(old.total_timesteps // 2)]
    state = old.state_dict()
    json.dumps(state)  # plain types only
    file = tmp_path / "ckpt.pt"
    torch.save({"factory": state}, file)
    loaded = torch.load(file, weights_only=True)["factory"]
    assert loaded == state
    new = make_factory(name, kwargs, seed=13, granularity=2)
    new.load_state_dict(loaded)
    rest = [new.get_modification(s) for s in range(new.total_timesteps // 2, new.total_timesteps)]
    assert first_half + rest == every_step(make_factory(name, kwargs, seed=13, granularity=2))
    # Dict and list phase forms describe the same factory.
    if name == "EpsCombined" and isinstance(kwargs["modification_factory_kwargs"], dict):
        as_list = {
            "epsilon": kwargs["epsilon"],
            "modification_factory_kwargs": [
                seq(n, **kw) for n, kw in kwargs["modification_factory_kwargs"].items()
            ],
        }
        make_factory(name, as_list, seed=13, granularity=2).load_state_dict(loaded)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"seed": 14}, "seed"),
        ({"granularity": 3}, "granularity"),
        ({"kwargs": {"num_total_steps": 11, "modifications": ["a", "b"], "switching_thresholds": [4]}}, "num_total_steps"),
        ({"kwargs": {"num_total_steps": 10, "modifications": ["a", "b"], "switching_thresholds": [5]}}, "switching_thresholds"),
        ({"kwargs": {"num_total_steps": 10, "modifications": ["a", "c"], "switching_thresholds": [4]}}, "modifications"),
        ({"name": "EpsSequential", "kwargs": {"num_total_steps": 10, "modifications": ["a", "b"], "switching_thresholds": [4]}}, "modification_factory"),
    ],
)
def test_load_state_dict_mismatch_names_the_difference(change: dict[str, Any], field: str) -> None:
    base_kwargs = {"num_total_steps": 10, "modifications": ["a", "b"], "switching_thresholds": [4]}
    saved = make_factory("Sequential", base_kwargs, seed=13, granularity=2).state_dict()
    current = make_factory(
        change.get("name", "Sequential"),
        change.get("kwargs", base_kwargs),
        seed=change.get("seed", 13),
        granularity=change.get("granularity", 2),
    )
    with pytest.raises(FactoryConfigError, match=field) as info:
        current.load_state_dict(saved)
    assert "\n" not in str(info.value)


def test_load_state_dict_rejects_non_dict() -> None:
    f = make_factory("NoModification", {"num_total_steps": 3})
    with pytest.raises(FactoryConfigError, match="state_dict"):
        f.load_state_dict([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- #
# Invalid arguments
# --------------------------------------------------------------------------- #
SEQ_OK = {"num_total_steps": 100, "modifications": ["a", "b"], "switching_thresholds": [50]}
RND_OK = {"num_total_steps": 100, "modifications": ["a", "b"]}
ALL_OK = {"num_total_steps": 100, "modifications": [["a", "b"], ["", "c"]]}
PHASE_OK = {"SequentialModificationFactory": {"num_total_steps": 10, "modifications": ["a"], "switching_thresholds": []}}

BAD_ARGS: list[tuple[str, str, dict[str, Any], str]] = [
    # (id, factory, kwargs, expected field path in the message)
    ("steps_bool", "NoModification", {"num_total_steps": True}, "modification_factory_kwargs.num_total_steps"),
    ("steps_zero", "NoModification", {"num_total_steps": 0}, "num_total_steps"),
    ("steps_negative", "Sequential", {**SEQ_OK, "num_total_steps": -5}, "num_total_steps"),
    ("steps_nan", "Random", {**RND_OK, "num_total_steps": float("nan")}, "num_total_steps"),
    ("steps_inf", "Random", {**RND_OK, "num_total_steps": math.inf}, "num_total_steps"),
    ("steps_fraction", "Random", {**RND_OK, "num_total_steps": 10.5}, "num_total_steps"),
    ("steps_string", "NoModification", {"num_total_steps": "100"}, "num_total_steps"),
    ("steps_none", "NoModification", {"num_total_steps": None}, "num_total_steps"),
    ("mods_string", "Sequential", {**SEQ_OK, "modifications": "ab", "switching_thresholds": [50]}, "modifications"),
    ("mods_empty", "Sequential", {**SEQ_OK, "modifications": [], "switching_thresholds": []}, "modifications"),
    ("mods_non_str", "Sequential", {**SEQ_OK, "modifications": ["a", 3]}, "modifications[1]"),
    ("mods_nested", "Random", {**RND_OK, "modifications": [["a"]]}, "modifications[0]"),
    ("thr_wrong_count", "Sequential", {**SEQ_OK, "switching_thresholds": [10, 20]}, "switching_thresholds"),
    ("thr_missing_for_two", "Sequential", {**SEQ_OK, "switching_thresholds": []}, "switching_thresholds"),
    ("thr_not_increasing", "Sequential", {**SEQ_OK, "modifications": ["a", "b", "c"], "switching_thresholds": [10, 5]}, "switching_thresholds"),
    ("thr_equal", "Sequential", {**SEQ_OK, "modifications": ["a", "b", "c"], "switching_thresholds": [10, 10]}, "switching_thresholds"),
    ("thr_zero", "Sequential", {**SEQ_OK, "switching_thresholds": [0]}, "switching_thresholds[0]"),
    ("thr_total", "Sequential", {**SEQ_OK, "switching_thresholds": [100]}, "switching_thresholds[0]"),
    ("thr_beyond", "Sequential", {**SEQ_OK, "switching_thresholds": [500]}, "switching_thresholds[0]"),
    ("thr_bool", "Sequential", {**SEQ_OK, "switching_thresholds": [True]}, "switching_thresholds[0]"),
    ("thr_fraction", "Sequential", {**SEQ_OK, "switching_thresholds": [10.5]}, "switching_thresholds[0]"),
    ("thr_not_list", "Sequential", {**SEQ_OK, "switching_thresholds": 50}, "switching_thresholds"),
    ("probs_wrong_len", "Random", {**RND_OK, "probabilities": [1.0]}, "probabilities"),
    ("probs_negative", "Random", {**RND_OK, "probabilities": [1.5, -0.5]}, "probabilities[1]"),
    ("probs_sum", "Random", {**RND_OK, "probabilities": [0.5, 0.4]}, "probabilities"),
    ("probs_nan", "Random", {**RND_OK, "probabilities": [float("nan"), 1.0]}, "probabilities[0]"),
    ("probs_bool", "Random", {**RND_OK, "probabilities": [True, False]}, "probabilities[0]"),
    ("probs_string", "Random", {**RND_OK, "probabilities": "0.5,0.5"}, "probabilities"),
    ("probs_joint_len", "AllCombinationsRandom", {**ALL_OK, "probabilities": [0.5, 0.5]}, "probabilities"),
    ("reps_zero", "Random", {**RND_OK, "num_repetitions": 0}, "num_repetitions"),
    ("reps_bool", "Random", {**RND_OK, "num_repetitions": True}, "num_repetitions"),
    ("reps_float", "AllCombinationsRandom", {**ALL_OK, "num_repetitions": 2.5}, "num_repetitions"),
    ("eps_above_one", "EpsSequential", {**SEQ_OK, "epsilon": 1.5}, "epsilon"),
    ("eps_negative", "EpsSequential", {**SEQ_OK, "epsilon": -0.1}, "epsilon"),
    ("eps_nan", "EpsCombined", {"modification_factory_kwargs": PHASE_OK, "epsilon": float("nan")}, "epsilon"),
    ("eps_string", "EpsCombined", {"modification_factory_kwargs": PHASE_OK, "epsilon": "0.1"}, "epsilon"),
    ("eps_bool", "EpsSequential", {**SEQ_OK, "epsilon": True}, "epsilon"),
    ("all_factor_empty", "AllCombinationsRandom", {**ALL_OK, "modifications": [["a"], []]}, "modifications[1]"),
    ("all_factor_string", "AllCombinationsRandom", {**ALL_OK, "modifications": ["ab", ["c"]]}, "modifications[0]"),
    ("all_empty", "AllCombinationsRandom", {**ALL_OK, "modifications": []}, "modifications"),
    ("all_too_many", "AllCombinationsRandom", {**ALL_OK, "modifications": [[str(i) for i in range(1001)]] * 2}, "modifications"),
    ("unknown_kwarg", "Sequential", {**SEQ_OK, "epsilon": 0.1}, "modification_factory_kwargs.epsilon"),
    ("missing_kwarg", "Sequential", {"num_total_steps": 100, "modifications": ["a"]}, "modification_factory_kwargs.switching_thresholds"),
    ("missing_steps", "Random", {"modifications": ["a"]}, "modification_factory_kwargs.num_total_steps"),
    ("seed_in_kwargs", "Random", {**RND_OK, "seed": 3}, "modification_factory_kwargs.seed"),
    ("combined_empty_dict", "Combined", {"modification_factory_kwargs": {}}, "modification_factory_kwargs.modification_factory_kwargs"),
    ("combined_empty_list", "EpsCombined", {"modification_factory_kwargs": []}, "modification_factory_kwargs.modification_factory_kwargs"),
    ("combined_not_dict", "Combined", {"modification_factory_kwargs": "Sequential"}, "modification_factory_kwargs.modification_factory_kwargs"),
    ("combined_steps_kwarg", "Combined", {"modification_factory_kwargs": PHASE_OK, "num_total_steps": 10}, "modification_factory_kwargs.num_total_steps"),
    (
        "combined_nested_field",
        "Combined",
        {"modification_factory_kwargs": {"SequentialModificationFactory": {**SEQ_OK, "num_total_steps": -1}}},
        "modification_factory_kwargs.modification_factory_kwargs.SequentialModificationFactory.num_total_steps",
    ),
    (
        "combined_nested_unknown_factory",
        "Combined",
        {"modification_factory_kwargs": {"Bogus": {}}},
        "modification_factory_kwargs.modification_factory_kwargs",
    ),
    (
        "combined_phase_kwargs_not_dict",
        "Combined",
        {"modification_factory_kwargs": {"Sequential": [1, 2]}},
        "modification_factory_kwargs.modification_factory_kwargs.Sequential",
    ),
    (
        "combined_list_missing_name",
        "Combined",
        {"modification_factory_kwargs": [{"modification_factory_kwargs": {}}]},
        "modification_factory_kwargs.modification_factory_kwargs[0].modification_factory",
    ),
    (
        "combined_list_extra_key",
        "Combined",
        {"modification_factory_kwargs": [{**seq("NoModification", num_total_steps=3), "extra": 1}]},
        "modification_factory_kwargs.modification_factory_kwargs[0].extra",
    ),
    (
        "combined_list_nested_field",
        "EpsCombined",
        {"modification_factory_kwargs": [seq("NoModification", num_total_steps=3), seq("Random", num_total_steps=3, modifications=["a"], num_repetitions=0)]},
        "modification_factory_kwargs.modification_factory_kwargs[1].modification_factory_kwargs.num_repetitions",
    ),
    (
        "nested_combined_path",
        "Combined",
        {"modification_factory_kwargs": {"Combined": {"modification_factory_kwargs": {"NoModification": {"num_total_steps": 0}}}}},
        "modification_factory_kwargs.modification_factory_kwargs.Combined.modification_factory_kwargs.NoModification.num_total_steps",
    ),
]


@pytest.mark.parametrize("name, kwargs, field", [c[1:] for c in BAD_ARGS], ids=[c[0] for c in BAD_ARGS])
def test_bad_arguments_raise_one_line_error_naming_field(name: str, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(FactoryConfigError) as info:
        make_factory(name, kwargs)
    message = str(info.value)
    assert field in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)


def test_error_message_format_examples() -> None:
    with pytest.raises(FactoryConfigError) as info:
        make_factory("Sequential", {**SEQ_OK, "modifications": ["a", "b", "c"], "switching_thresholds": [10, 5]})
    assert str(info.value) == "modification_factory_kwargs.switching_thresholds: must be strictly increasing, got [10, 5]"
    with pytest.raises(FactoryConfigError, match=r"must have len\(modifications\)-1 = 1 entries"):
        make_factory("Sequential", {**SEQ_OK, "switching_thresholds": []})
    with pytest.raises(FactoryConfigError, match=r"sum 0\.9"):
        make_factory("Random", {**RND_OK, "probabilities": [0.5, 0.4]})


def test_direct_construction_validates_with_custom_path() -> None:
    with pytest.raises(FactoryConfigError, match=r"^cfg\.num_total_steps: "):
        mf.NoModificationFactory(0, _path="cfg")
    with pytest.raises(FactoryConfigError, match=r"^seed: "):
        mf.NoModificationFactory(3, seed=-1)
    with pytest.raises(FactoryConfigError, match=r"^granularity: "):
        mf.NoModificationFactory(3, granularity=0)
    with pytest.raises(FactoryConfigError, match=r"^granularity: "):
        mf.NoModificationFactory(3, granularity=True)


def test_probabilities_within_tolerance_accepted() -> None:
    f = make_factory("Random", {**RND_OK, "probabilities": [0.5, 0.5 + 5e-7]})
    assert set(every_step(f)) <= {"a", "b"}


@pytest.mark.parametrize("bad", [None, [], "x", 3])
def test_make_factory_kwargs_must_be_dict(bad: Any) -> None:
    with pytest.raises(FactoryConfigError, match="modification_factory_kwargs"):
        make_factory("NoModification", bad)


@pytest.mark.parametrize("name", ["Bogus", "", "sequential", 42, "no_such_module_xyz:Factory", "tests/missing.py:X"])
def test_unknown_factory_name(name: Any) -> None:
    with pytest.raises(FactoryConfigError) as info:
        mf.get_factory_class(name)
    assert str(info.value).startswith("modification_factory: ")
    assert "\n" not in str(info.value)


def test_unknown_factory_lists_known_names() -> None:
    with pytest.raises(FactoryConfigError) as info:
        make_factory("Bogus", {})
    message = str(info.value)
    assert message.startswith("modification_factory: unknown factory 'Bogus'; known: ")
    assert "SequentialModificationFactory" in message and "Sequential," in message


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #
def test_builtin_names_and_aliases_registered() -> None:
    for cls in (
        mf.NoModificationFactory,
        mf.SequentialModificationFactory,
        mf.EpsSequentialModificationFactory,
        mf.RandomModificationFactory,
        mf.AllCombinationsRandomModificationFactory,
        mf.CombinedModificationFactory,
        mf.EpsCombinedModificationFactory,
    ):
        assert FACTORIES[cls.__name__] is cls
        assert FACTORIES[cls.__name__[: -len("ModificationFactory")]] is cls
        assert mf.get_factory_class(cls.__name__) is cls


@register_factory()
class EveryOtherModificationFactory(ModificationFactory):
    """A user factory: alternates two modifications every decision."""

    def __init__(self, num_total_steps: int, first: str, second: str = "", *, seed: int = 0, granularity: int = 1, _path: str = "modification_factory_kwargs") -> None:
        super().__init__(num_total_steps, seed=seed, granularity=granularity, _path=_path)
        self.first, self.second = first, second

    def modification_at(self, step: int) -> str:
        return self.first if self.decision_index(step) % 2 == 0 else self.second


def test_user_factory_registered_by_decorator() -> None:
    assert FACTORIES["EveryOther"] is EveryOtherModificationFactory
    f = make_factory("EveryOther", {"num_total_steps": 8, "first": "b  a"}, granularity=2)
    assert f.schedule() == [(0, 2, "a b"), (2, 4, ""), (4, 6, "a b"), (6, 8, "")]
    assert f.possible_modifications() == ["", "a b"]
    state = f.state_dict()
    assert state["modification_factory"] == "EveryOtherModificationFactory"
    assert state["modification_factory_kwargs"] == {"num_total_steps": 8, "first": "b  a"}
    make_factory("EveryOtherModificationFactory", {"num_total_steps": 8, "first": "b  a"}, granularity=2).load_state_dict(state)
    with pytest.raises(FactoryConfigError, match="first"):
        make_factory("EveryOther", {"num_total_steps": 8, "first": "c"}, granularity=2).load_state_dict(state)
    with pytest.raises(FactoryConfigError, match=r"modification_factory_kwargs\.first: missing"):
        make_factory("EveryOther", {"num_total_steps": 8})
    with pytest.raises(FactoryConfigError, match=r"modification_factory_kwargs\.third: unknown"):
        make_factory("EveryOther", {"num_total_steps": 8, "first": "a", "third": 1})
    # Inside a Combined phase, offset by a phase that is not a multiple of the granularity.
    combined = make_factory(
        "Combined",
        {"modification_factory_kwargs": {"NoModification": {"num_total_steps": 3}, "EveryOther": {"num_total_steps": 8, "first": "x"}}},
        granularity=2,
    )
    assert combined.schedule() == [(0, 4, ""), (4, 6, "x"), (6, 8, ""), (8, 10, "x"), (10, 11, "")]


def test_register_factory_with_explicit_name_and_conflict() -> None:
    @register_factory("my_custom_name")
    class CustomModificationFactory(EveryOtherModificationFactory):
        pass

    try:
        assert FACTORIES["my_custom_name"] is CustomModificationFactory
        assert FACTORIES["Custom"] is CustomModificationFactory
        with pytest.raises(ValueError, match="already registered"):

            @register_factory("my_custom_name")
            class Other(EveryOtherModificationFactory):
                pass

        with pytest.raises(TypeError):
            register_factory()(dict)  # type: ignore[type-var]
    finally:
        for key in ("my_custom_name", "Custom", "CustomModificationFactory"):
            FACTORIES.pop(key, None)


USER_MODULE = """
from modification_factories import ModificationFactory


class FileModificationFactory(ModificationFactory):
    def __init__(self, num_total_steps, word, *, seed=0, granularity=1, _path="modification_factory_kwargs"):
        super().__init__(num_total_steps, seed=seed, granularity=granularity, _path=_path)
        if not isinstance(word, str):
            raise ValueError("word must be a string")
        self.word = word
        self.rng_value = int(self.make_rng(0).integers(1000))

    def modification_at(self, step):
        return self.word if step < self.total_timesteps // 2 else ""


class NotAFactory:
    pass
"""


def test_import_path_factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "user_factories_for_test.py"
    file.write_text(textwrap.dedent(USER_MODULE))
    f = make_factory(f"{file}:FileModificationFactory", {"num_total_steps": 4, "word": "w"})
    assert every_step(f) == ["w", "w", "", ""]
    assert make_factory(f"{file}:FileModificationFactory", {"num_total_steps": 4, "word": "w"}).rng_value == f.rng_value
    # Relative file path from the current directory, and dotted module path.
    monkeypatch.chdir(tmp_path)
    rel = make_factory("user_factories_for_test.py:FileModificationFactory", {"num_total_steps": 2, "word": "v"})
    assert rel.schedule() == [(0, 1, "v"), (1, 2, "")]
    monkeypatch.syspath_prepend(str(tmp_path))
    dotted = make_factory("user_factories_for_test:FileModificationFactory", {"num_total_steps": 2, "word": "u"})
    assert dotted.get_modification(0) == "u"
    # Inside Combined by import path.
    combined = make_factory(
        "Combined",
        {"modification_factory_kwargs": [seq(f"{file}:FileModificationFactory", num_total_steps=2, word="q"), seq("NoModification", num_total_steps=1)]},
    )
    assert every_step(combined) == ["q", "", ""]
    with pytest.raises(FactoryConfigError, match="neither a ModificationFactory subclass nor a class with get_modification"):
        mf.get_factory_class(f"{file}:NotAFactory")
    with pytest.raises(FactoryConfigError, match="cannot import"):
        mf.get_factory_class(f"{file}:Missing")
    with pytest.raises(FactoryConfigError, match=r"^modification_factory_kwargs: ValueError: word must be a string$"):
        make_factory(f"{file}:FileModificationFactory", {"num_total_steps": 2, "word": 3})


# --------------------------------------------------------------------------- #
# Preview CLI
# --------------------------------------------------------------------------- #
def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "modification_factories.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_table(tmp_path: Path) -> None:
    config = {
        "modification_factory": "Combined",
        "modification_factory_kwargs": {
            "modification_factory_kwargs": [
                seq("Sequential", num_total_steps=100, modifications=["all_green_cars reverse_car_speed_top"], switching_thresholds=[]),
                seq("NoModification", num_total_steps=50),
            ]
        },
        "seed": 3,
        "num_envs": 2,
        "num_steps": 25,
        "learning_rate": 0.1,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_cli(str(path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    first_line = out.splitlines()[0]
    # As training builds it: built-ins decide per step whatever num_envs * num_steps (50) is, and the preview says so.
    assert "Combined" in first_line and "150" in first_line and "granularity 1," in first_line
    assert out.splitlines()[1].startswith("rule: built-in factories decide per step")
    assert "seed 3" in first_line and "1 switches" in first_line
    assert "all_green_cars reverse_car_speed_top" in out
    assert "(none)" in out
    for column in ("start", "end", "steps", "modification"):
        assert column in out
    assert "possible modifications" in out

    overridden = run_cli(str(path), "--granularity", "40", "--seed", "9", "--max-rows", "1")
    assert overridden.returncode == 0, overridden.stderr
    assert "granularity 40" in overridden.stdout and "seed 9" in overridden.stdout
    assert "more rows" in overridden.stdout


def test_cli_readme_config_default_granularity(tmp_path: Path) -> None:
    path = tmp_path / "readme.json"
    path.write_text(json.dumps(README_CONFIG))
    result = run_cli(str(path))
    assert result.returncode == 0, result.stderr
    assert "granularity 1," in result.stdout and "seed 1" in result.stdout
    assert "the same under PPO and IMPALA" in result.stdout
    assert "disable_cars" in result.stdout


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"modification_factory_kwargs": {"num_total_steps": 3}}),
        json.dumps({"modification_factory": "Bogus", "modification_factory_kwargs": {}}),
        json.dumps({"modification_factory": "Sequential", "modification_factory_kwargs": {**SEQ_OK, "switching_thresholds": [10, 5]}}),
        json.dumps({"modification_factory": "NoModification", "modification_factory_kwargs": {"num_total_steps": 3}, "seed": "x"}),
        json.dumps({"modification_factory": "NoModification", "modification_factory_kwargs": {"num_total_steps": 3}, "num_envs": 0, "num_steps": 4}),
        None,  # missing file
    ],
)
def test_cli_bad_input_single_error_line(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    result = run_cli(str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr


def test_preview_plain_text_without_rich(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for module in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, module, None)  # makes "from rich... import" fail
    f = make_factory("Sequential", {"num_total_steps": 10, "modifications": ["", "b a"], "switching_thresholds": [4]}, granularity=2)
    from continual.curricula.preview import _print_preview

    _print_preview(f, "Sequential", max_rows=0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Sequential: total 10 steps, granularity 2, seed 0, 1 switches"
    assert lines[1] == mf.granularity_rule(f)
    assert lines[2].split() == ["start", "end", "steps", "modification"]
    assert lines[3].split() == ["0", "4", "4", "(none)"]
    assert lines[4].split() == ["4", "10", "6", "a", "b"]
    assert lines[5] == "possible modifications (2):"


# --------------------------------------------------------------------------- #
# Seed-style factories: a plain class with get_modification(step) (issue 12, item 1)
# --------------------------------------------------------------------------- #
SEED_STYLE_MODULE = '''
import random

import numpy as np


class SeedStyleFactory:
    """As the seed document describes it: num_total_steps + kwargs, get_modification(step) -> str.
    Stateful on purpose: it counts its calls and re-draws from the *global* np.random / random every 2nd call."""

    def __init__(self, num_total_steps, modifications, hold=2):
        self.num_total_steps = num_total_steps
        self.modifications = modifications
        self.hold = hold
        self.calls = 0
        self.current = modifications[0]
        self.offset = random.randrange(1000)  # constructors may draw too

    def get_modification(self, step):
        if self.calls % self.hold == self.hold - 1:
            self.current = self.modifications[int(np.random.randint(len(self.modifications)))]
        self.calls += 1
        return self.current
'''


def seed_style_reference(modifications: list[str], n_calls: int, seed: int, hold: int = 2) -> list[str]:
    """Hand-written reference of the contract: a fresh object, its calls made in order, with the global RNGs
    seeded from `seed` (random.Random(seed) / np.random.RandomState(MT19937(seed)) states)."""
    py, npr = random.Random(seed), np.random.RandomState(np.random.MT19937(seed))
    py.randrange(1000)
    current, out = modifications[0], []
    for call in range(n_calls):
        if call % hold == hold - 1:
            current = modifications[int(npr.randint(len(modifications)))]
        out.append(normalize_modification(current))
    return out


@pytest.fixture
def seed_style_file(tmp_path: Path) -> Path:
    file = tmp_path / "my_seed_factories.py"
    file.write_text(SEED_STYLE_MODULE)
    return file


SEED_MODS = ["", "gravity=15", "length=0.8", "gravity=5 length=0.3"]


def test_seed_style_plain_class_by_file_path(seed_style_file: Path) -> None:
    spec = f"{seed_style_file}:SeedStyleFactory"
    f = make_factory(spec, {"num_total_steps": 40, "modifications": SEED_MODS}, seed=3, granularity=4)
    expected = seed_style_reference(SEED_MODS, 10, seed=3)
    assert [f.get_modification(s) for s in range(0, 40, 4)] == expected
    assert every_step(f) == [m for m in expected for _ in range(4)]  # constant within a decision
    # Any call order gives the in-order answers (a fresh object, steps asked backwards).
    g = make_factory(spec, {"num_total_steps": 40, "modifications": SEED_MODS}, seed=3, granularity=4)
    assert [g.get_modification(s) for s in reversed(range(40))] == list(reversed(every_step(f)))
    assert f.possible_modifications() == sorted(set(expected))
    assert make_factory(spec, {"num_total_steps": 40, "modifications": SEED_MODS}, seed=4, granularity=4).schedule() \
        != f.schedule()
    assert f.total_timesteps == 40 and f.factory_name() == spec
    with pytest.raises(ValueError, match="outside"):
        f.get_modification(40)


def test_seed_style_leaves_the_global_rng_alone(seed_style_file: Path) -> None:
    random.seed(123)
    np.random.seed(123)
    before = (random.random(), np.random.random())
    random.seed(123)
    np.random.seed(123)
    f = make_factory(f"{seed_style_file}:SeedStyleFactory", {"num_total_steps": 64, "modifications": SEED_MODS},
                     seed=1, granularity=1)
    f.schedule()
    assert (random.random(), np.random.random()) == before


def test_seed_style_registered_in_modification_factory_mapping(seed_style_file: Path) -> None:
    assert mf.modification_factory_mapping is FACTORIES  # one registry, the seed's name for it
    assert mf.modification_factory_mapping["SequentialModificationFactory"] is mf.SequentialModificationFactory
    ns: dict[str, Any] = {}
    exec(SEED_STYLE_MODULE, ns)
    mf.modification_factory_mapping["SeedStyleFactory"] = ns["SeedStyleFactory"]
    try:
        f = make_factory("SeedStyleFactory", {"num_total_steps": 24, "modifications": SEED_MODS, "hold": 3},
                         seed=7, granularity=4)
        assert [f.get_modification(s) for s in range(0, 24, 4)] == seed_style_reference(SEED_MODS, 6, 7, hold=3)
        state = f.state_dict()
        assert state["modification_factory"] == "SeedStyleFactory"
        assert state["modification_factory_kwargs"] == {"num_total_steps": 24, "modifications": SEED_MODS, "hold": 3}
        make_factory("SeedStyleFactory", {"num_total_steps": 24, "modifications": SEED_MODS, "hold": 3},
                     seed=7, granularity=4).load_state_dict(state)
        # As a phase of a Combined factory too.
        combined = make_factory("Combined", {"modification_factory_kwargs": [
            seq("NoModification", num_total_steps=8),
            seq("SeedStyleFactory", num_total_steps=16, modifications=SEED_MODS)]}, seed=7, granularity=4)
        assert combined.get_modification(0) == ""
        with pytest.raises(FactoryConfigError, match=r"modification_factory_kwargs\.modifications: missing"):
            make_factory("SeedStyleFactory", {"num_total_steps": 8})
        with pytest.raises(FactoryConfigError, match=r"modification_factory_kwargs\.seed: not allowed"):
            make_factory("SeedStyleFactory", {"num_total_steps": 8, "modifications": ["a"], "seed": 1})
    finally:
        del mf.modification_factory_mapping["SeedStyleFactory"]
    mf.modification_factory_mapping["NotAFactoryAtAll"] = dict  # type: ignore[assignment]
    try:
        with pytest.raises(FactoryConfigError, match="neither a ModificationFactory subclass"):
            make_factory("NotAFactoryAtAll", {"num_total_steps": 8})
    finally:
        del mf.modification_factory_mapping["NotAFactoryAtAll"]


def test_subclass_overriding_get_modification_only() -> None:
    """The seed's contract on a ModificationFactory subclass: get_modification instead of modification_at."""

    class Halves(ModificationFactory):
        def __init__(self, num_total_steps: int, word: str) -> None:
            super().__init__(num_total_steps)
            self.word = word

        def get_modification(self, step: int) -> str:
            return self.word if step < self.total_timesteps // 2 else ""

    f = make_factory(Halves, {"num_total_steps": 8, "word": "w"}, granularity=2)
    assert f.schedule() == [(0, 4, "w"), (4, 8, "")]
    assert f.possible_modifications() == ["", "w"]


def test_make_run_factory_builtins_per_step_user_code_per_rollout(seed_style_file: Path) -> None:
    kwargs = README_CONFIG["modification_factory_kwargs"]
    for rollout in (1024, 320, 64):
        f = mf.make_run_factory(README_CONFIG["modification_factory"], kwargs, seed=1, rollout_size=rollout)
        assert f.granularity == 1 and not mf.uses_user_code(f)
    user = mf.make_run_factory(f"{seed_style_file}:SeedStyleFactory",
                               {"num_total_steps": 4096, "modifications": SEED_MODS}, seed=1, rollout_size=256)
    assert user.granularity == 256 and mf.uses_user_code(user)
    nested = mf.make_run_factory("Combined", {"modification_factory_kwargs": [
        seq("NoModification", num_total_steps=512),
        seq(f"{seed_style_file}:SeedStyleFactory", num_total_steps=512, modifications=SEED_MODS)]},
        seed=1, rollout_size=128)
    assert nested.granularity == 128


# --------------------------------------------------------------------------- #
# Seed-style factories in training: train, resume, same schedule (subprocess, CartPole)
# --------------------------------------------------------------------------- #
SEED_TRAIN_CONFIG = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 32, "update_epochs": 1,
    "reward_scaling": "none",
}
MAPPING_LAUNCHER = """
import sys
sys.path.insert(0, {dir!r})
sys.path.insert(0, {repo!r})  # the repository root: continual_training_example.py is a script, not installed
import modification_factories
from my_seed_factories import SeedStyleFactory
modification_factories.modification_factory_mapping["SeedStyleFactory"] = SeedStyleFactory
import continual_training_example
continual_training_example.main(sys.argv[1:])
"""


def _switches(run_dir: Path) -> list[tuple[int, str]]:
    from continual.training.tracking import read_metrics

    return [(r["global_step"], r["modification"]) for r in read_metrics(str(run_dir / "metrics.jsonl"))
            if r["kind"] == "switch"]


@pytest.mark.parametrize("how", [pytest.param("file", marks=pytest.mark.slow), "mapping"])
def test_seed_style_factory_trains_and_resumes_with_the_same_schedule(how: str, seed_style_file: Path,
                                                                     tmp_path: Path) -> None:
    from conftest import run_script

    if how == "file":
        name, script = f"{seed_style_file}:SeedStyleFactory", ["continual_training_example.py"]
    else:
        launcher = tmp_path / "launch.py"
        launcher.write_text(MAPPING_LAUNCHER.format(dir=str(seed_style_file.parent), repo=str(REPO_ROOT)))
        name, script = "SeedStyleFactory", [str(launcher)]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({**SEED_TRAIN_CONFIG, "modification_factory": name, "modification_factory_kwargs": {
        "num_total_steps": 1024, "modifications": SEED_MODS}}))
    runs = tmp_path / "runs"
    common = ["--runs_dir", str(runs), "--no-progress-bar", "--seed", "5"]
    run_script(*script, "--config", str(cfg), "--run_name", "full", *common)
    run_script(*script, "--config", str(cfg), "--run_name", "cut", "--total_timesteps", "320", *common)
    run_script(*script, "--resume", str(runs / "cut"), "--total_timesteps", "1024", "--no-progress-bar")

    # The schedule the contract defines: calls at 0, 64, 128, ... (rollout 2 x 32), global RNGs seeded from 5.
    answers = seed_style_reference(SEED_MODS, 1024 // 64, seed=5)
    expected = [(k * 64, m) for k, m in enumerate(answers) if k > 0 and m != answers[k - 1]]
    assert len(expected) >= 3
    assert _switches(runs / "full") == expected
    assert _switches(runs / "cut") == expected
    assert any(step > 320 for step, _ in expected) and any(step <= 320 for step, _ in expected)


def test_cli_user_factory_preview_uses_the_rollout_size(seed_style_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "user.json"
    path.write_text(json.dumps({"modification_factory": f"{seed_style_file}:SeedStyleFactory", "num_envs": 2,
                                "num_steps": 16, "modification_factory_kwargs": {"num_total_steps": 320,
                                                                                 "modifications": SEED_MODS}}))
    result = run_cli(str(path))
    assert result.returncode == 0, result.stderr
    assert "granularity 32," in result.stdout
    assert "rule: your factory is asked once per rollout, at steps 0, 32, 64, ..." in result.stdout


def test_seed_style_failures_are_one_line_config_errors() -> None:
    class Raises:
        def __init__(self, num_total_steps):
            self.num_total_steps = num_total_steps

        def get_modification(self, step):
            if step >= 4:
                raise KeyError("boom")
            return ""

    class ReturnsInt(Raises):
        def get_modification(self, step):
            return 3

    f = make_factory(Raises, {"num_total_steps": 8}, granularity=2)
    assert f.get_modification(2) == ""
    with pytest.raises(FactoryConfigError, match=r"^modification_factory_kwargs: .*Raises\.get_modification\(4\) "
                                                 r"raised KeyError: 'boom'$"):
        f.possible_modifications()
    with pytest.raises(FactoryConfigError, match=r"get_modification\(0\) returned 3 \(int\), expected a str"):
        make_factory(ReturnsInt, {"num_total_steps": 8}).get_modification(0)
    with pytest.raises(FactoryConfigError, match=r"num_total_steps: missing"):
        make_factory(Raises, {})
