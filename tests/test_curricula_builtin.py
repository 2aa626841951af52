"""continual/curricula/builtin.py: the seven built-in factories' schedules (hand computed), randomness (first
blocks, repetitions, frequencies), the epsilon factories' replay, bad arguments (one line naming the field), and
make_run_factory's granularity (per step for built-ins, per rollout for user code)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import modification_factories as mf
from helpers.curricula_cases import (
    EPS_PHASES,
    README_CONFIG,
    SCHEDULE_CASES,
    SEED_MODS,
    SEQ_OK,
    every_step,
    expand,
    seq,
)
from modification_factories import (
    FactoryConfigError,
    ModificationFactory,
    make_factory,
)


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


def test_probabilities_within_tolerance_accepted() -> None:
    f = make_factory("Random", {**RND_OK, "probabilities": [0.5, 0.5 + 5e-7]})
    assert set(every_step(f)) <= {"a", "b"}


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
