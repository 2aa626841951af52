"""continual/curricula/base.py: the factory contract on the built-in factories: steps in range and integer, the
schedule a pure function of (seed, step) with private random streams, possible_modifications, state_dict round trips
and mismatches, validation of the constructor's own arguments, a subclass overriding get_modification only."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import modification_factories as mf
from helpers.curricula_cases import (
    EPS_PHASES,
    README_CONFIG,
    SCHEDULE_CASES,
    every_step,
    expand,
    seq,
)
from modification_factories import (
    FactoryConfigError,
    ModificationFactory,
    make_factory,
)


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


def test_direct_construction_validates_with_custom_path() -> None:
    with pytest.raises(FactoryConfigError, match=r"^cfg\.num_total_steps: "):
        mf.NoModificationFactory(0, _path="cfg")
    with pytest.raises(FactoryConfigError, match=r"^seed: "):
        mf.NoModificationFactory(3, seed=-1)
    with pytest.raises(FactoryConfigError, match=r"^granularity: "):
        mf.NoModificationFactory(3, granularity=0)
    with pytest.raises(FactoryConfigError, match=r"^granularity: "):
        mf.NoModificationFactory(3, granularity=True)


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
