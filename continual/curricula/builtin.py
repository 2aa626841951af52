"""The seven built-in factories, and how a training run builds its factory (`make_run_factory`)."""

from __future__ import annotations

import bisect
import itertools
import math
from abc import abstractmethod
from typing import Any

import numpy as np

from continual.curricula.base import (
    _TAG_EPS_COMBINED,
    _TAG_EPS_SEQUENTIAL,
    _TAG_RANDOM,
    DEFAULT_PATH,
    MAX_COMBINATIONS,
    FactoryConfigError,
    ModificationFactory,
    _check_int,
    _check_list,
    _check_probabilities,
    _check_probability,
    _check_str_list,
    _check_thresholds,
    _derive_seed,
    _first_point,
    _fmt_typed,
    _iter_grid,
    _UniformStream,
    normalize_modification,
)
from continual.curricula.registry import make_factory, register_factory


# --------------------------------------------------------------------------- #
# Built-in factories
# --------------------------------------------------------------------------- #
class _BuiltinFactory(ModificationFactory):
    """Built-ins implement the vectorised hooks; ``modification_at`` derives from them."""

    def modification_at(self, step: int) -> str:
        return self._vocab[self._code(step)]

    @abstractmethod
    def _code(self, step: int) -> int: ...

    @abstractmethod
    def _codes(self, steps: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _support(self, offset: int) -> set[str]: ...


@register_factory("NoModification")  # "No" alone (the automatic alias) reads oddly
class NoModificationFactory(_BuiltinFactory):
    """Always the unmodified game (``""``)."""

    def __init__(
        self, num_total_steps: int, *, seed: int = 0, granularity: int = 1, _path: str = DEFAULT_PATH
    ) -> None:
        super().__init__(num_total_steps, seed=seed, granularity=granularity, _path=_path)
        self._intern("")

    def config(self) -> dict[str, Any]:
        return {"num_total_steps": self.total_timesteps}

    def _code(self, step: int) -> int:
        return 0

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        return np.zeros(len(steps), dtype=np.int64)

    def _support(self, offset: int) -> set[str]:
        return {""}


@register_factory()
class SequentialModificationFactory(_BuiltinFactory):
    """``modifications[i]`` on ``[thr[i-1], thr[i])``; see module docstring."""

    def __init__(
        self,
        num_total_steps: int,
        modifications: list[str],
        switching_thresholds: list[int],
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        super().__init__(num_total_steps, seed=seed, granularity=granularity, _path=_path)
        self._modifications = _check_str_list(modifications, f"{_path}.modifications")
        self._thresholds = _check_thresholds(
            switching_thresholds, len(self._modifications), self.total_timesteps, f"{_path}.switching_thresholds"
        )
        self._thr = np.asarray(self._thresholds, dtype=np.int64)
        self._entry_codes = np.asarray(
            [self._intern(normalize_modification(m)) for m in self._modifications], dtype=np.int64
        )

    def config(self) -> dict[str, Any]:
        return {
            "num_total_steps": self.total_timesteps,
            "modifications": list(self._modifications),
            "switching_thresholds": list(self._thresholds),
        }

    def _entry(self, step: int) -> int:
        return bisect.bisect_right(self._thresholds, step)

    def _entries(self, steps: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._thr, steps, side="right")

    def _code(self, step: int) -> int:
        return int(self._entry_codes[self._entry(step)])

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        return self._entry_codes[self._entries(steps)]

    def _reachable_entries(self, offset: int) -> list[int]:
        """Entries whose interval contains a grid point ``offset + k * granularity``."""
        bounds = [0, *self._thresholds, self.total_timesteps]
        return [
            i
            for i in range(len(self._modifications))
            if _first_point(offset, bounds[i], self._granularity) < bounds[i + 1]
        ]

    def _support(self, offset: int) -> set[str]:
        return {self._vocab[int(self._entry_codes[i])] for i in self._reachable_entries(offset)}


@register_factory()
class EpsSequentialModificationFactory(SequentialModificationFactory):
    """Sequential with per-decision replay of an earlier entry with probability ``epsilon``."""

    def __init__(
        self,
        num_total_steps: int,
        modifications: list[str],
        switching_thresholds: list[int],
        epsilon: float = 0.05,
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        super().__init__(
            num_total_steps, modifications, switching_thresholds, seed=seed, granularity=granularity, _path=_path
        )
        self._epsilon = _check_probability(epsilon, f"{_path}.epsilon")
        self._stream = _UniformStream(self._seed, _TAG_EPS_SEQUENTIAL, 2)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "epsilon": self._epsilon}

    def _code(self, step: int) -> int:
        idx = self._entry(step)
        if idx > 0 and self._epsilon > 0:
            u = self._stream.at(step // self._granularity)
            if u[0] < self._epsilon:
                idx = min(int(u[1] * idx), idx - 1)
        return int(self._entry_codes[idx])

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        idx = self._entries(steps)
        if self._epsilon > 0 and len(steps):
            u = self._stream.take(steps // self._granularity)
            replay = (u[:, 0] < self._epsilon) & (idx > 0)
            earlier = np.minimum((u[:, 1] * idx).astype(np.int64), idx - 1)
            idx = np.where(replay, earlier, idx)
        return self._entry_codes[idx]

    def _support(self, offset: int) -> set[str]:
        reachable = self._reachable_entries(offset)
        entries = set(reachable)
        if self._epsilon >= 1.0:
            entries &= {0}  # every later entry always replays
        if self._epsilon > 0 and reachable:
            entries |= set(range(max(reachable)))
        return {self._vocab[int(self._entry_codes[i])] for i in entries}


class _RandomBase(_BuiltinFactory):
    """Shared block-wise drawing for Random and AllCombinationsRandom."""

    def _setup_random(
        self, entries: list[str], probabilities: Any, num_repetitions: Any, path: str
    ) -> None:
        self._probabilities = _check_probabilities(probabilities, len(entries), f"{path}.probabilities")
        self._num_repetitions = _check_int(num_repetitions, f"{path}.num_repetitions", minimum=1)
        self._entry_codes = np.asarray([self._intern(e) for e in entries], dtype=np.int64)
        p = np.full(len(entries), 1.0 / len(entries)) if self._probabilities is None else np.asarray(self._probabilities)
        p = p / p.sum()
        cdf = np.cumsum(p)
        # Pin the cdf to exactly 1 from the last positive entry on, so u < 1 never lands on a p=0 tail.
        last_positive = int(np.flatnonzero(p > 0)[-1])
        cdf[last_positive:] = 1.0
        self._cdf = cdf
        self._positive = p > 0
        self._stream = _UniformStream(self._seed, _TAG_RANDOM, 1)

    def _random_config(self) -> dict[str, Any]:
        return {"probabilities": self._probabilities, "num_repetitions": self._num_repetitions}

    def _code(self, step: int) -> int:
        block = (step // self._granularity) // self._num_repetitions
        entry = int(np.searchsorted(self._cdf, self._stream.at(block)[0], side="right"))
        return int(self._entry_codes[entry])

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        blocks = (steps // self._granularity) // self._num_repetitions
        entries = np.searchsorted(self._cdf, self._stream.take(blocks)[:, 0], side="right")
        return self._entry_codes[entries]

    def _support(self, offset: int) -> set[str]:
        return {self._vocab[int(c)] for c in self._entry_codes[self._positive]}


@register_factory()
class RandomModificationFactory(_RandomBase):
    """One draw from ``modifications`` per block of ``num_repetitions`` decisions."""

    def __init__(
        self,
        num_total_steps: int,
        modifications: list[str],
        probabilities: list[float] | None = None,
        num_repetitions: int = 1,
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        super().__init__(num_total_steps, seed=seed, granularity=granularity, _path=_path)
        self._modifications = _check_str_list(modifications, f"{_path}.modifications")
        self._setup_random(
            [normalize_modification(m) for m in self._modifications], probabilities, num_repetitions, _path
        )

    def config(self) -> dict[str, Any]:
        return {
            "num_total_steps": self.total_timesteps,
            "modifications": list(self._modifications),
            **self._random_config(),
        }


@register_factory()
class AllCombinationsRandomModificationFactory(_RandomBase):
    """Random over every combination of one entry per factor (``itertools.product``)."""

    def __init__(
        self,
        num_total_steps: int,
        modifications: list[list[str]],
        probabilities: list[float] | None = None,
        num_repetitions: int = 1,
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        super().__init__(num_total_steps, seed=seed, granularity=granularity, _path=_path)
        factors_path = f"{_path}.modifications"
        factors = _check_list(modifications, factors_path, what="lists of strings")
        if not factors:
            raise FactoryConfigError("must be a non-empty list of lists of strings, got []", path=factors_path)
        self._factors = [_check_str_list(f, f"{factors_path}[{i}]") for i, f in enumerate(factors)]
        n = math.prod(len(f) for f in self._factors)
        if n > MAX_COMBINATIONS:
            raise FactoryConfigError(f"has {n} combinations, more than the limit {MAX_COMBINATIONS}", path=factors_path)
        entries = [normalize_modification(list(combo)) for combo in itertools.product(*self._factors)]
        self._setup_random(entries, probabilities, num_repetitions, _path)

    def config(self) -> dict[str, Any]:
        return {
            "num_total_steps": self.total_timesteps,
            "modifications": [list(f) for f in self._factors],
            **self._random_config(),
        }


def _parse_phases(spec: Any, path: str) -> list[tuple[str, Any, str, str]]:
    """Both accepted phase forms -> ``[(factory_name, kwargs, kwargs_path, name_path)]``."""
    phases: list[tuple[str, Any, str, str]] = []
    if isinstance(spec, dict):
        for name, kwargs in spec.items():
            if not isinstance(name, str):
                raise FactoryConfigError(f"keys must be factory names, got {_fmt_typed(name)}", path=path)
            phases.append((name, kwargs, f"{path}.{name}", path))
    elif isinstance(spec, (list, tuple)):
        for j, item in enumerate(spec):
            item_path = f"{path}[{j}]"
            if not isinstance(item, dict):
                raise FactoryConfigError(
                    "must be a dict {'modification_factory': name, 'modification_factory_kwargs': {...}}, "
                    f"got {_fmt_typed(item)}",
                    path=item_path,
                )
            unknown = sorted(set(item) - {"modification_factory", "modification_factory_kwargs"}, key=str)
            if unknown:
                raise FactoryConfigError(
                    "unknown key; expected modification_factory, modification_factory_kwargs",
                    path=f"{item_path}.{unknown[0]}",
                )
            if "modification_factory" not in item:
                raise FactoryConfigError("missing required key", path=f"{item_path}.modification_factory")
            name = item["modification_factory"]
            if not isinstance(name, str):
                raise FactoryConfigError(
                    f"must be a factory name string, got {_fmt_typed(name)}", path=f"{item_path}.modification_factory"
                )
            kwargs = item.get("modification_factory_kwargs", {})
            phases.append(
                (name, kwargs, f"{item_path}.modification_factory_kwargs", f"{item_path}.modification_factory")
            )
    else:
        raise FactoryConfigError(
            f"must be a dict {{factory_name: kwargs}} or a list of phases, got {_fmt_typed(spec)}", path=path
        )
    if not phases:
        raise FactoryConfigError("must contain at least one phase, got none", path=path)
    return phases


@register_factory()
class CombinedModificationFactory(_BuiltinFactory):
    """Phases of sub-factories run back to back."""

    def __init__(
        self,
        modification_factory_kwargs: dict[str, dict[str, Any]] | list[dict[str, Any]],
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        super().__init__(seed=seed, granularity=granularity, _path=_path)
        phases = _parse_phases(modification_factory_kwargs, f"{_path}.modification_factory_kwargs")
        self._phases: list[ModificationFactory] = []
        for j, (name, kwargs, kwargs_path, name_path) in enumerate(phases):
            self._phases.append(
                make_factory(
                    name,
                    kwargs,
                    seed=_derive_seed(self._seed, j),
                    granularity=self._granularity,
                    path=kwargs_path,
                    name_path=name_path,
                )
            )
        lengths = [phase.total_timesteps for phase in self._phases]
        self._starts = [0, *itertools.accumulate(lengths)][:-1]
        self._ends = list(itertools.accumulate(lengths))
        self._starts_arr = np.asarray(self._starts, dtype=np.int64)
        self._total = self._ends[-1]
        # Per-phase sub-code -> own code tables, extended lazily (user sub-factories intern lazily).
        self._maps: list[list[int]] = [[] for _ in self._phases]
        for j in range(len(self._phases)):
            self._map_table(j)

    @property
    def phases(self) -> list[ModificationFactory]:
        return list(self._phases)

    @property
    def phase_starts(self) -> list[int]:
        return list(self._starts)

    def config(self) -> dict[str, Any]:
        return {
            "modification_factory_kwargs": [
                {"modification_factory": phase.factory_name(), "modification_factory_kwargs": phase.config()}
                for phase in self._phases
            ]
        }

    def _map_table(self, j: int) -> list[int]:
        table, sub_vocab = self._maps[j], self._phases[j]._vocab
        while len(table) < len(sub_vocab):
            table.append(self._intern(sub_vocab[len(table)]))
        return table

    def _phase(self, step: int) -> int:
        return bisect.bisect_right(self._starts, step) - 1

    def _code(self, step: int) -> int:
        j = self._phase(step)
        sub_code = self._phases[j]._code(step - self._starts[j])
        return self._map_table(j)[sub_code]

    def _phase_codes(self, j: int, local_steps: np.ndarray) -> np.ndarray:
        sub_codes = self._phases[j]._codes(local_steps)
        return np.asarray(self._map_table(j), dtype=np.int64)[sub_codes]

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        out = np.empty(len(steps), dtype=np.int64)
        js = np.searchsorted(self._starts_arr, steps, side="right") - 1
        for j in np.unique(js).tolist():
            mask = js == j
            out[mask] = self._phase_codes(j, steps[mask] - self._starts[j])
        return out

    def _phase_offset(self, j: int, offset: int) -> int | None:
        """Local offset of phase ``j``'s first grid point, or None if the phase has none."""
        p = _first_point(offset, self._starts[j], self._granularity)
        return p - self._starts[j] if p < self._ends[j] else None

    def _support(self, offset: int) -> set[str]:
        out: set[str] = set()
        for j, phase in enumerate(self._phases):
            local = self._phase_offset(j, offset)
            if local is not None:
                out |= phase._support(local)
        return out


@register_factory()
class EpsCombinedModificationFactory(CombinedModificationFactory):
    """Combined with per-decision replay of strings emitted by earlier phases."""

    def __init__(
        self,
        modification_factory_kwargs: dict[str, dict[str, Any]] | list[dict[str, Any]],
        epsilon: float = 0.05,
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        super().__init__(modification_factory_kwargs, seed=seed, granularity=granularity, _path=_path)
        self._epsilon = _check_probability(epsilon, f"{_path}.epsilon")
        self._stream = _UniformStream(self._seed, _TAG_EPS_COMBINED, 2)
        self._pool_cache: dict[int, list[list[int]]] = {}

    def config(self) -> dict[str, Any]:
        return {**super().config(), "epsilon": self._epsilon}

    def replay_pools(self, offset: int = 0) -> list[list[str]]:
        """Replay pool (sorted strings) of every phase for the grid ``offset + k * granularity``."""
        return [[self._vocab[c] for c in pool] for pool in self._pools(offset)]

    def _pools(self, offset: int) -> list[list[int]]:
        pools = self._pool_cache.get(offset)
        if pools is None:
            # Computed once from the earlier phases' actual schedules (pure, so caching is safe).
            emitted: set[str] = set()
            pools = []
            for j, phase in enumerate(self._phases):
                pools.append([self._intern(s) for s in sorted(emitted)])
                local = self._phase_offset(j, offset)
                if local is None:
                    continue
                for points in _iter_grid(local, phase.total_timesteps, self._granularity):
                    emitted.update(self._vocab[c] for c in np.unique(self._phase_codes(j, points)).tolist())
            self._pool_cache[offset] = pools
        return pools

    def _code(self, step: int) -> int:
        code = super()._code(step)
        if self._epsilon > 0:
            j = self._phase(step)
            if j > 0:
                u = self._stream.at(step // self._granularity)
                if u[0] < self._epsilon:
                    pool = self._pools(step % self._granularity)[j]
                    if pool:
                        code = pool[min(int(u[1] * len(pool)), len(pool) - 1)]
        return code

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        codes = super()._codes(steps)
        if self._epsilon <= 0 or not len(steps):
            return codes
        js = np.searchsorted(self._starts_arr, steps, side="right") - 1
        candidates = np.flatnonzero(js > 0)
        if not len(candidates):
            return codes
        u = self._stream.take(steps[candidates] // self._granularity)
        hit = u[:, 0] < self._epsilon
        candidates, u = candidates[hit], u[hit]
        offsets = steps[candidates] % self._granularity
        for key in {(int(o), int(j)) for o, j in zip(offsets, js[candidates])}:
            pool = self._pools(key[0])[key[1]]
            if not pool:
                continue
            sel = (offsets == key[0]) & (js[candidates] == key[1])
            picks = np.minimum((u[sel, 1] * len(pool)).astype(np.int64), len(pool) - 1)
            codes[candidates[sel]] = np.asarray(pool, dtype=np.int64)[picks]
        return codes

    def _support(self, offset: int) -> set[str]:
        if self._epsilon < 1.0:
            return super()._support(offset)
        # With epsilon == 1 a phase with a non-empty pool only ever replays.
        out: set[str] = set()
        seen_earlier = False
        for j, phase in enumerate(self._phases):
            local = self._phase_offset(j, offset)
            if local is None:
                continue
            if not seen_earlier:
                out |= phase._support(local)
            seen_earlier = True
        return out


# --------------------------------------------------------------------------- #
# The factory a training run uses
# --------------------------------------------------------------------------- #
SCHEDULE_GRANULARITY = 1  # built-in factories decide per step, whatever the agent's rollout size


def uses_user_code(factory: ModificationFactory) -> bool:
    """True if any (sub-)factory is not a built-in."""
    if not isinstance(factory, _BuiltinFactory):
        return True
    return any(uses_user_code(phase) for phase in getattr(factory, "_phases", ()))


def make_run_factory(name: str, kwargs: dict[str, Any], *, seed: int, rollout_size: int) -> ModificationFactory:
    """The factory training uses. Built-in factories get granularity 1: thresholds, phase lengths and
    ``num_repetitions`` count agent steps, so one config is one schedule under every agent (PPO, IMPALA, any
    rollout size); the agent switches at the first rollout start at or after a switch of that schedule.
    A curriculum with your own factory in it is asked once per rollout instead (granularity ``rollout_size``),
    which is how a seed-style ``get_modification`` is called during training."""
    factory = make_factory(name, kwargs, seed=seed, granularity=SCHEDULE_GRANULARITY)
    if uses_user_code(factory) and rollout_size != SCHEDULE_GRANULARITY:
        factory = make_factory(name, kwargs, seed=seed, granularity=_check_int(rollout_size, "rollout_size", minimum=1))
    return factory


def granularity_rule(factory: ModificationFactory) -> str:
    """One line saying how training samples this factory's schedule."""
    if uses_user_code(factory):
        return (f"rule: your factory is asked once per rollout, at steps 0, {factory.granularity}, "
                f"{2 * factory.granularity}, ... (granularity = the agent's rollout size)")
    return ("rule: built-in factories decide per step (num_repetitions, thresholds and phases count agent steps), "
            "so this schedule is the same under PPO and IMPALA; training switches at the first rollout start "
            "at or after each switch")
