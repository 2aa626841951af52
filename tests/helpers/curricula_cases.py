"""Shared cases of the curricula tests (tests/test_curricula_*.py): the README's config, phase and schedule helpers,
the hand-computed schedules, the epsilon factories' phases, a valid Sequential config and the seed-style
modifications."""

from __future__ import annotations

from typing import Any

from modification_factories import ModificationFactory

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


EPS_PHASES = [
    seq("Random", num_total_steps=400, modifications=[f"r{i}" for i in range(10)], num_repetitions=100),
    seq("Sequential", num_total_steps=300, modifications=["s"], switching_thresholds=[]),
    seq("NoModification", num_total_steps=300),
]


SEQ_OK = {"num_total_steps": 100, "modifications": ["a", "b"], "switching_thresholds": [50]}


SEED_MODS = ["", "gravity=15", "length=0.8", "gravity=5 length=0.3"]
