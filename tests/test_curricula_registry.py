"""continual/curricula/registry.py: names and aliases, user factories by decorator, by name and by import path,
unknown names, and seed-style plain classes (CallReplayFactory): by file path or the mapping, the global RNG left
alone, trained and resumed with the same schedule, failures as one-line config errors."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import modification_factories as mf
from conftest import SEED_STYLE_MODULE, write_config
from helpers.curricula_cases import (
    SEED_MODS,
    every_step,
    seq,
)
from modification_factories import (
    FACTORIES,
    FactoryConfigError,
    ModificationFactory,
    make_factory,
    normalize_modification,
    register_factory,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


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
    from conftest import run_main, run_script

    if how == "file":
        name, script = f"{seed_style_file}:SeedStyleFactory", ["continual_training_example.py"]
    else:
        launcher = tmp_path / "launch.py"
        launcher.write_text(MAPPING_LAUNCHER.format(dir=str(seed_style_file.parent), repo=str(REPO_ROOT)))
        name, script = "SeedStyleFactory", [str(launcher)]
    cfg = write_config(tmp_path, {**SEED_TRAIN_CONFIG, "modification_factory": name, "modification_factory_kwargs": {
        "num_total_steps": 1024, "modifications": SEED_MODS}}, "cfg.json")
    runs = tmp_path / "runs"
    common = ["--runs_dir", str(runs), "--no-progress-bar", "--seed", "5"]
    if how == "file":
        run_script(*script, "--config", str(cfg), "--run_name", "full", *common)
    else:  # the uninterrupted run in this process (a process less); the launcher registers it for the two below
        ns: dict[str, Any] = {}
        exec(SEED_STYLE_MODULE, ns)
        mf.modification_factory_mapping["SeedStyleFactory"] = ns["SeedStyleFactory"]
        try:
            run_main("continual_training_example.py", "--config", str(cfg), "--run_name", "full", *common)
        finally:
            del mf.modification_factory_mapping["SeedStyleFactory"]
    run_script(*script, "--config", str(cfg), "--run_name", "cut", "--total_timesteps", "320", *common)
    run_script(*script, "--resume", str(runs / "cut"), "--total_timesteps", "1024", "--no-progress-bar")

    # The schedule the contract defines: calls at 0, 64, 128, ... (rollout 2 x 32), global RNGs seeded from 5.
    answers = seed_style_reference(SEED_MODS, 1024 // 64, seed=5)
    expected = [(k * 64, m) for k, m in enumerate(answers) if k > 0 and m != answers[k - 1]]
    assert len(expected) >= 3
    assert _switches(runs / "full") == expected
    assert _switches(runs / "cut") == expected
    assert any(step > 320 for step, _ in expected) and any(step <= 320 for step, _ in expected)


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
