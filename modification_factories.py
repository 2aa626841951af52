"""Modification factories: curricula of game modifications for continual RL.

A *modification factory* maps the training global step (agent steps summed over
all parallel environments) to a *modification string*: space-separated
modification names such as ``"all_green_cars reverse_car_speed_top"`` (for the
Gymnasium backend tokens look like ``"gravity=12.0 length=0.7"``), or ``""`` for
the unmodified game. Whenever the string for the current step differs from the
previous one, the training loop switches the environments.

Modification strings
--------------------
Every string a factory emits or lists is normalised by
:func:`normalize_modification`: split on whitespace, empty tokens dropped,
duplicates removed, tokens sorted, joined with single spaces (``""`` for none).
So ``" b  a a"`` becomes ``"a b"``. Tokens are never interpreted, so conflicting
tokens such as ``"gravity=1 gravity=2"`` are both kept.

Steps, decisions and granularity
--------------------------------
The training loop asks the factory at the start of each rollout. Each factory
takes a keyword-only ``granularity`` (default 1; training uses 1 for built-in
curricula, see "Granularity in training") and counts everything in *decisions*:
decision ``d`` covers the steps ``[d * granularity, (d + 1) * granularity)``.

Quantisation rule (all factories): the string at step ``s`` is the factory's
rule evaluated at the decision start ``(s // granularity) * granularity``. A
switch therefore happens at the first decision boundary at or after a
threshold / phase end, and the string is constant within a decision. Random
draws and ``num_repetitions`` are counted in decisions, never in steps or calls.

``get_modification(step)`` is a pure function of (constructor arguments, seed,
granularity, step): it does not depend on call history, may be called in any
order, and is O(1) amortised. It is defined for ``0 <= step < total_timesteps``
and raises ``ValueError`` outside. Randomness comes only from a private numpy
RNG derived from ``seed`` (``np.random.SeedSequence``; random numbers are
generated lazily in fixed-size chunks of decisions), never from the global
``np.random`` / ``random`` state. The same seed gives the same schedule,
different seeds give different random schedules.

Built-in factories (also registered under the short alias without the
``ModificationFactory`` suffix, e.g. ``"Sequential"``)
----------------------------------------------------------------------------
``NoModificationFactory(num_total_steps)``
    Always ``""``. Also registered as ``"NoModification"``.

``SequentialModificationFactory(num_total_steps, modifications, switching_thresholds)``
    ``modifications[i]`` is active on ``[thr[i-1], thr[i])`` with ``thr[-1] = 0``
    and ``thr[len] = num_total_steps``. ``switching_thresholds`` must have
    ``len(modifications) - 1`` strictly increasing entries, each in
    ``(0, num_total_steps)`` (so one modification takes ``[]``).

``EpsSequentialModificationFactory(..., epsilon=0.05)``
    Like Sequential, but at each decision, with probability ``epsilon``, if the
    current entry index ``idx > 0`` a uniformly chosen earlier entry
    (index ``< idx``) is returned for that decision only. The first entry never
    replays. ``epsilon`` in ``[0, 1]``.

``RandomModificationFactory(num_total_steps, modifications, probabilities=None, num_repetitions=1)``
    Decisions are grouped in blocks ``b = d // num_repetitions``; every block,
    including the first, draws one modification with ``probabilities`` (uniform
    if ``None``), held for exactly ``num_repetitions`` decisions (the last block
    may be cut short by the end). Probabilities: same length as
    ``modifications``, each finite and ``>= 0``, summing to 1 within 1e-6.
    Duplicate entries are allowed.

``AllCombinationsRandomModificationFactory(num_total_steps, modifications, probabilities=None, num_repetitions=1)``
    Random over the normalised join of every element of
    ``itertools.product(*modifications)`` (in product order). Each factor is a
    non-empty list of strings; ``""`` factors are allowed and vanish.
    ``probabilities`` is over the joint product (length = product of factor
    sizes; at most 1,000,000 combinations).

``CombinedModificationFactory(modification_factory_kwargs)``
    Phases run back to back: phase ``j`` covers ``[start_j, start_j + total_j)``
    and its sub-factory is evaluated at ``step - start_j`` (after the
    quantisation above, in the parent's step coordinates; a phase containing no
    decision start is skipped). ``modification_factory_kwargs`` is either a dict
    ``{factory_name: kwargs}`` (dict order = phase order) or a list of
    ``{"modification_factory": name, "modification_factory_kwargs": {...}}``
    (one class may then appear in several phases). Sub-factories inherit the
    granularity and get a distinct seed derived from the parent seed and the
    phase index. Nesting is allowed. ``total_timesteps`` is the sum of phases.

``EpsCombinedModificationFactory(modification_factory_kwargs, epsilon=0.05)``
    As Combined, but at each decision in phase ``j > 0``, with probability
    ``epsilon``, a uniformly random string from the replay pool of phase ``j``
    is returned: the set of strings actually emitted (at decision boundaries)
    by phases ``0..j-1`` without this factory's own replay. Phase 0, or a phase
    whose pool is empty, never replays.

Your own factory: the seed's contract
-------------------------------------
A plain class (no base class needed) with ``__init__(num_total_steps, **kwargs)`` and
``get_modification(step) -> str``, registered with
``modification_factory_mapping["MyFactory"] = MyFactory`` (the same dict as
:data:`FACTORIES`) or named by import path, is run by :class:`CallReplayFactory`:
it is asked once per decision, at steps ``0, g, 2g, ...`` in this order, and its
answers are recorded, so it may keep state (count calls) and draw from the global
``random`` / ``np.random`` (a private state seeded from the run's seed is swapped
in around each call). A resumed run replays the calls from step 0 and so
continues the same schedule. The same holds for a ``ModificationFactory``
subclass that overrides ``get_modification`` instead of ``modification_at``.

Granularity in training (:func:`make_run_factory`)
---------------------------------------------------
A curriculum of built-in factories is built with granularity 1: thresholds,
phase lengths and ``num_repetitions`` count agent steps, so one config is one
schedule under every agent and rollout size; the agent switches at the first
rollout start at or after a switch. A curriculum containing your own factory is
built with the agent's rollout size as granularity (asked once per rollout).

Public API
----------
``normalize_modification``, ``FactoryConfigError``, ``ModificationFactory``
(``get_modification``, ``total_timesteps``, ``seed``, ``granularity``,
``possible_modifications``, ``schedule``/``iter_schedule``, ``state_dict``,
``load_state_dict``, ``config``; hooks ``modification_at``, ``make_rng``,
``decision_index``), the seven factories above (Combined also exposes
``phases``/``phase_starts``, EpsCombined ``replay_pools``), ``FACTORIES``,
``modification_factory_mapping``, ``register_factory``, ``get_factory_class``,
``make_factory``, ``CallReplayFactory``, ``make_run_factory``, ``uses_user_code``,
``granularity_rule`` and ``main``.

``possible_modifications()`` is the support: every string emitted with
probability > 0 over seeds (entries with probability 0, entries/phases that
contain no decision start, and, with ``epsilon == 1``, entries that always
replay are excluded).

Configuration, errors and the registry
--------------------------------------
Factories are built from config with :func:`make_factory` (name, kwargs dict,
seed, granularity). Every invalid argument raises :class:`FactoryConfigError`
(a ``ValueError``) with a one-line message naming the field by a dotted path,
e.g. ``modification_factory_kwargs.switching_thresholds: must be strictly
increasing, got [10, 5]``. Step counts (``num_total_steps``,
``switching_thresholds``) accept integral floats such as ``1e6``; other
integers must be real ints (never bool). ``seed`` and ``granularity`` are
passed separately and may not appear in the kwargs.

:data:`FACTORIES` maps names to classes. Decorate your own subclass with
:func:`register_factory` to make it available by name, or refer to it with an
import path ``"package.module:ClassName"`` / ``"path/to/file.py:ClassName"``.
A user factory calls ``super().__init__(num_total_steps, seed=seed,
granularity=granularity, _path=_path)`` and implements
``modification_at(step)`` (the rule at a decision start, local step); it may
use ``self.make_rng(...)`` for private randomness and override
``possible_modifications``/``state_dict``/``load_state_dict`` if it has real
state.

Checkpoints
-----------
``state_dict()`` holds plain types only (safe for
``torch.load(weights_only=True)``): factory name, canonical kwargs, seed,
granularity and total steps. Since factories are pure, ``load_state_dict``
only verifies that these match the current factory and raises
``FactoryConfigError`` naming every difference, so a resumed run provably
continues the same schedule.

Preview
-------
``python modification_factories.py CONFIG.json [--granularity N] [--seed S]
[--max-rows N]`` prints the run-length-encoded schedule of the config's
``modification_factory`` / ``modification_factory_kwargs``. Granularity
defaults to ``num_envs * num_steps`` from the config (else 8 * 128 = 1024),
the seed to the config's ``seed`` (else 1). Bad input prints one
``error: ...`` line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import importlib
import importlib.util
import inspect
import itertools
import json
import math
import os
import random
import sys
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar, overload

import numpy as np

__all__ = [
    "FACTORIES",
    "CallReplayFactory",
    "SCHEDULE_GRANULARITY",
    "granularity_rule",
    "make_run_factory",
    "modification_factory_mapping",
    "uses_user_code",
    "AllCombinationsRandomModificationFactory",
    "CombinedModificationFactory",
    "EpsCombinedModificationFactory",
    "EpsSequentialModificationFactory",
    "FactoryConfigError",
    "ModificationFactory",
    "NoModificationFactory",
    "RandomModificationFactory",
    "SequentialModificationFactory",
    "get_factory_class",
    "main",
    "make_factory",
    "normalize_modification",
    "register_factory",
]

DEFAULT_PATH = "modification_factory_kwargs"
STATE_FORMAT = "modification_factory/v1"
DEFAULT_GRANULARITY = 8 * 128  # training defaults num_envs * num_steps
MAX_COMBINATIONS = 1_000_000
PROBABILITY_TOLERANCE = 1e-6

_RNG_CHUNK = 1 << 16  # decisions per lazily generated random chunk
_RNG_CACHE_CHUNKS = 4
_EVAL_CHUNK = 1 << 16  # points per vectorised evaluation batch (bounds memory)
_SUFFIX = "ModificationFactory"
_RESERVED_KWARGS = ("seed", "granularity", "_path")

_UNSET: Any = object()  # "no num_total_steps given" (None must still be rejected)

# Stream tags keep the random streams of one seed independent.
_TAG_RANDOM = 0
_TAG_EPS_SEQUENTIAL = 1
_TAG_EPS_COMBINED = 2


# --------------------------------------------------------------------------- #
# Normalisation and errors
# --------------------------------------------------------------------------- #
def normalize_modification(modification: str | Sequence[str]) -> str:
    """Canonical form: whitespace-split, drop empties, de-duplicate, sort, join with one space."""
    if isinstance(modification, str):
        tokens = modification.split()
    elif isinstance(modification, (list, tuple)):
        tokens = []
        for part in modification:
            if not isinstance(part, str):
                raise TypeError(f"modification tokens must be strings, got {part!r}")
            tokens.extend(part.split())
    else:
        raise TypeError(f"modification must be a string or list of strings, got {modification!r}")
    return " ".join(sorted(set(tokens)))


def _one_line(text: str) -> str:
    return " ".join(text.split())


class FactoryConfigError(ValueError):
    """Invalid factory configuration; ``str(e)`` is one line ``"<dotted.path>: <problem>"``."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        self.problem = _one_line(message)
        super().__init__(self.problem if path is None else f"{path}: {self.problem}")


def _fmt(value: Any, limit: int = 80) -> str:
    text = _one_line(repr(value))
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _fmt_typed(value: Any) -> str:
    return f"{_fmt(value)} ({type(value).__name__})"


# --------------------------------------------------------------------------- #
# Argument validation (all raise FactoryConfigError naming the field)
# --------------------------------------------------------------------------- #
def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_int(value: Any, path: str, *, minimum: int) -> int:
    """Strict integer (no bool, no float) >= minimum."""
    if not _is_int(value):
        raise FactoryConfigError(f"must be an integer >= {minimum}, got {_fmt_typed(value)}", path=path)
    if value < minimum:
        raise FactoryConfigError(f"must be an integer >= {minimum}, got {int(value)}", path=path)
    return int(value)


def _check_steps(value: Any, path: str) -> int:
    """A positive step count; integral floats (JSON's 1e6) are accepted."""
    if _is_int(value):
        steps = int(value)
    elif isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        if not math.isfinite(value) or not float(value).is_integer():
            raise FactoryConfigError(f"must be a positive integer number of steps, got {_fmt(value)}", path=path)
        steps = int(value)
    else:
        raise FactoryConfigError(f"must be a positive integer number of steps, got {_fmt_typed(value)}", path=path)
    if steps <= 0:
        raise FactoryConfigError(f"must be a positive integer number of steps, got {steps}", path=path)
    return steps


def _check_list(value: Any, path: str, *, what: str) -> list[Any]:
    # A bare string is iterable, which would silently become a list of characters.
    if not isinstance(value, (list, tuple)):
        raise FactoryConfigError(f"must be a list of {what}, got {_fmt_typed(value)}", path=path)
    return list(value)


def _check_str_list(value: Any, path: str) -> list[str]:
    items = _check_list(value, path, what="strings")
    if not items:
        raise FactoryConfigError("must be a non-empty list of strings, got []", path=path)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise FactoryConfigError(f"must be a string, got {_fmt_typed(item)}", path=f"{path}[{i}]")
    return [str(item) for item in items]


def _check_probability(value: Any, path: str) -> float:
    if not _is_real(value) or not math.isfinite(float(value)) or not 0.0 <= float(value) <= 1.0:
        raise FactoryConfigError(f"must be a finite number in [0, 1], got {_fmt_typed(value)}", path=path)
    return float(value)


def _check_probabilities(value: Any, n: int, path: str) -> list[float] | None:
    if value is None:
        return None
    items = _check_list(value, path, what="numbers")
    if len(items) != n:
        raise FactoryConfigError(f"must have one entry per modification ({n}), got {len(items)}", path=path)
    probs: list[float] = []
    for i, item in enumerate(items):
        if not _is_real(item) or not math.isfinite(float(item)) or float(item) < 0:
            raise FactoryConfigError(f"must be a finite number >= 0, got {_fmt_typed(item)}", path=f"{path}[{i}]")
        probs.append(float(item))
    total = math.fsum(probs)
    if abs(total - 1.0) > PROBABILITY_TOLERANCE:
        raise FactoryConfigError(f"must sum to 1 (within {PROBABILITY_TOLERANCE:g}), got sum {total:.9g}", path=path)
    return probs


def _check_thresholds(value: Any, n_modifications: int, total: int, path: str) -> list[int]:
    items = _check_list(value, path, what="step counts")
    expected = n_modifications - 1
    if len(items) != expected:
        raise FactoryConfigError(
            f"must have len(modifications)-1 = {expected} entries, got {len(items)}", path=path
        )
    thresholds: list[int] = []
    for i, item in enumerate(items):
        if _is_int(item) or (isinstance(item, (float, np.floating)) and math.isfinite(item) and float(item).is_integer()):
            step = int(item)
        else:
            raise FactoryConfigError(f"must be an integer step count, got {_fmt_typed(item)}", path=f"{path}[{i}]")
        if not 0 < step < total:
            raise FactoryConfigError(
                f"must be in (0, num_total_steps={total}), got {step}", path=f"{path}[{i}]"
            )
        thresholds.append(step)
    for a, b in zip(thresholds, thresholds[1:]):
        if b <= a:
            raise FactoryConfigError(f"must be strictly increasing, got {thresholds}", path=path)
    return thresholds


# --------------------------------------------------------------------------- #
# Private randomness
# --------------------------------------------------------------------------- #
class _UniformStream:
    """Pure, lazily generated uniforms ``u[i, :width]`` indexed by a decision/block number.

    Chunk ``c`` is drawn from ``SeedSequence(seed, spawn_key=(tag, c))`` so any
    index is reproducible without generating the ones before it.
    """

    def __init__(self, seed: int, tag: int, width: int) -> None:
        self._seed = seed
        self._tag = tag
        self._width = width
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def _chunk(self, c: int) -> np.ndarray:
        arr = self._cache.get(c)
        if arr is None:
            seq = np.random.SeedSequence(entropy=self._seed, spawn_key=(self._tag, c))
            arr = np.random.default_rng(seq).random((_RNG_CHUNK, self._width))
            self._cache[c] = arr
            if len(self._cache) > _RNG_CACHE_CHUNKS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(c)
        return arr

    def at(self, i: int) -> np.ndarray:
        return self._chunk(i // _RNG_CHUNK)[i % _RNG_CHUNK]

    def take(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx), self._width))
        if len(idx) == 0:
            return out
        chunks = idx // _RNG_CHUNK
        order = np.argsort(chunks, kind="stable")
        sorted_chunks = chunks[order]
        cuts = np.flatnonzero(np.diff(sorted_chunks)) + 1
        for group in np.split(order, cuts):
            c = int(chunks[group[0]])
            out[group] = self._chunk(c)[idx[group] - c * _RNG_CHUNK]
        return out


def _derive_seed(seed: int, *key: int) -> int:
    """A distinct 64-bit seed for a child (e.g. a Combined phase)."""
    words = np.random.SeedSequence([seed, *key]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 32) | int(words[1])


def _iter_grid(start: int, stop: int, step: int) -> Iterator[np.ndarray]:
    """``range(start, stop, step)`` as int64 batches of bounded size."""
    span = step * _EVAL_CHUNK
    for lo in range(start, stop, span):
        yield np.arange(lo, min(stop, lo + span), step, dtype=np.int64)


def _first_point(offset: int, lo: int, granularity: int) -> int:
    """Smallest ``p >= lo`` with ``p = offset (mod granularity)``."""
    return lo + (offset - lo) % granularity


# --------------------------------------------------------------------------- #
# Base class
# --------------------------------------------------------------------------- #
class ModificationFactory(ABC):
    """Maps a training step to a normalised modification string (see module docstring).

    Subclasses implement :meth:`modification_at`. Built-in factories also
    override the vectorised private hooks ``_code``/``_codes``/``_support``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "ModificationFactory":
        self = super().__new__(cls)
        # Record constructor arguments so config()/state_dict() work for user classes too.
        try:
            bound = inspect.signature(cls.__init__).bind(self, *args, **kwargs)
            recorded: dict[str, Any] = {}
            for name, value in list(bound.arguments.items())[1:]:
                kind = bound.signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    recorded.update(value)
                elif kind is not inspect.Parameter.VAR_POSITIONAL:
                    recorded[name] = value
            self._init_args = {k: v for k, v in recorded.items() if k not in _RESERVED_KWARGS}
        except TypeError:
            self._init_args = {}
        return self

    def __init__(
        self,
        num_total_steps: int = _UNSET,
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        self._path = _path
        self._seed = _check_int(seed, "seed", minimum=0)
        self._granularity = _check_int(granularity, "granularity", minimum=1)
        self._total: int | None = None
        if num_total_steps is not _UNSET:  # composite factories derive their total instead
            self._total = _check_steps(num_total_steps, f"{_path}.num_total_steps")
        # Codes index this vocabulary; strings are interned so code equality == string equality.
        self._vocab: list[str] = []
        self._vocab_index: dict[str, int] = {}

    # ----- properties -------------------------------------------------------
    @property
    def total_timesteps(self) -> int:
        if self._total is None:
            raise RuntimeError(f"{type(self).__name__} did not set num_total_steps")
        return self._total

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def granularity(self) -> int:
        return self._granularity

    @classmethod
    def factory_name(cls) -> str:
        """Registered name, else ``module:QualName``."""
        if FACTORIES.get(cls.__name__) is cls:
            return cls.__name__
        for name, registered in FACTORIES.items():
            if registered is cls:
                return name
        return f"{cls.__module__}:{cls.__qualname__}"

    # ----- user hooks -------------------------------------------------------
    def modification_at(self, step: int) -> str:
        """The rule evaluated at local ``step`` (a decision start in the caller's grid).

        No range check and no quantisation; must be pure. ``step // granularity``
        is the decision index to key randomness on. (A subclass that overrides
        ``get_modification`` instead, as the seed's contract has it, is run by
        :func:`make_factory` through :class:`CallReplayFactory`.)
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither modification_at nor get_modification")

    def decision_index(self, step: int) -> int:
        return step // self._granularity

    def make_rng(self, *key: int) -> np.random.Generator:
        """A private generator derived from the seed and ``key`` (never the global RNG)."""
        return np.random.default_rng(np.random.SeedSequence(entropy=self._seed, spawn_key=tuple(key)))

    def config(self) -> dict[str, Any]:
        """Canonical constructor kwargs (plain types), stored in the state dict."""
        return _plain(self._init_args)

    # ----- private vectorised hooks ----------------------------------------
    def _intern(self, modification: str) -> int:
        code = self._vocab_index.get(modification)
        if code is None:
            code = len(self._vocab)
            self._vocab.append(modification)
            self._vocab_index[modification] = code
        return code

    def _code(self, step: int) -> int:
        return self._intern(normalize_modification(self.modification_at(step)))

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        return np.fromiter((self._code(int(s)) for s in steps), dtype=np.int64, count=len(steps))

    def _support(self, offset: int) -> set[str]:
        """Strings emittable (probability > 0) at local steps ``offset + k * granularity``."""
        codes: set[int] = set()
        for points in _iter_grid(offset, self.total_timesteps, self._granularity):
            codes.update(np.unique(self._codes(points)).tolist())
        return {self._vocab[c] for c in codes}

    # ----- public API -------------------------------------------------------
    def get_modification(self, step: int) -> str:
        """Normalised modification string for global ``step`` in ``[0, total_timesteps)``."""
        if not _is_int(step):
            raise TypeError(f"step must be an integer, got {_fmt_typed(step)}")
        step = int(step)
        total = self.total_timesteps
        if not 0 <= step < total:
            raise ValueError(f"step {step} is outside [0, {total}) of {type(self).__name__}")
        return self._vocab[self._code(step - step % self._granularity)]

    def possible_modifications(self) -> list[str]:
        """Sorted unique strings this factory can emit with probability > 0 (over seeds)."""
        return sorted(self._support(0))

    def iter_schedule(self, granularity: int | None = None) -> Iterator[tuple[int, int, str]]:
        """Lazy form of :meth:`schedule`."""
        g = self._granularity if granularity is None else _check_int(granularity, "granularity", minimum=1)
        total = self.total_timesteps
        run_start: int | None = None
        run_code = -1
        for points in _iter_grid(0, total, g):
            codes = self._codes(points - points % self._granularity)
            changes = np.flatnonzero(codes[1:] != codes[:-1]) + 1
            starts = [0, *changes.tolist()]
            for i in starts:
                code = int(codes[i])
                if run_start is not None and code == run_code:
                    continue
                start = int(points[i])
                if run_start is not None:
                    yield (run_start, start, self._vocab[run_code])
                run_start, run_code = start, code
        if run_start is not None:
            yield (run_start, total, self._vocab[run_code])

    def schedule(self, granularity: int | None = None) -> list[tuple[int, int, str]]:
        """Run-length-encoded ``(start, end_exclusive, modification)`` evaluated at every
        multiple of ``granularity`` (default: the factory's), equal neighbours merged."""
        return list(self.iter_schedule(granularity))

    def state_dict(self) -> dict[str, Any]:
        """Plain-typed identity of the schedule (torch ``weights_only`` safe)."""
        return {
            "format": STATE_FORMAT,
            "modification_factory": self.factory_name(),
            "modification_factory_kwargs": self.config(),
            "seed": self._seed,
            "granularity": self._granularity,
            "total_timesteps": self.total_timesteps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Verify a checkpoint describes this exact factory; raise FactoryConfigError on any difference."""
        if not isinstance(state_dict, dict):
            raise FactoryConfigError(f"must be a dict, got {_fmt_typed(state_dict)}", path="state_dict")
        mine = self.state_dict()
        diffs: list[str] = []
        _diff(state_dict, mine, "state_dict", diffs)
        if diffs:
            shown = "; ".join(diffs[:5]) + (f"; ... {len(diffs) - 5} more" if len(diffs) > 5 else "")
            raise FactoryConfigError(f"checkpoint does not match the current factory: {shown}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(total_timesteps={self._total}, seed={self._seed}, "
            f"granularity={self._granularity})"
        )


def _plain(value: Any) -> Any:
    """Convert to JSON/torch-safe plain types."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if _is_int(value):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def _diff(loaded: Any, current: Any, path: str, out: list[str]) -> None:
    if isinstance(loaded, dict) and isinstance(current, dict):
        for key in sorted(set(loaded) | set(current), key=str):
            if key not in loaded:
                out.append(f"{path}.{key}: missing in checkpoint, current factory has {_fmt(current[key])}")
            elif key not in current:
                out.append(f"{path}.{key}: checkpoint has {_fmt(loaded[key])}, current factory has no such field")
            else:
                _diff(loaded[key], current[key], f"{path}.{key}", out)
    elif isinstance(loaded, (list, tuple)) and isinstance(current, (list, tuple)) and len(loaded) == len(current):
        for i, (a, b) in enumerate(zip(loaded, current)):
            _diff(a, b, f"{path}[{i}]", out)
    elif loaded != current or isinstance(loaded, bool) != isinstance(current, bool):
        out.append(f"{path}: checkpoint has {_fmt(loaded)}, current factory has {_fmt(current)}")


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #
FACTORIES: dict[str, type] = {}
# The seed's name for the registry (the same dict): ``modification_factory_mapping["MyFactory"] = MyFactory``
# registers a plain class with ``__init__(num_total_steps, **kwargs)`` and ``get_modification(step) -> str``.
modification_factory_mapping = FACTORIES

F = TypeVar("F", bound=type[ModificationFactory])


def _same_class(a: type, b: type) -> bool:
    # A module re-executed (reload, file imported twice) redefines an equal class.
    return a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)


@overload
def register_factory(name: F) -> F: ...
@overload
def register_factory(name: str | None = None) -> Callable[[F], F]: ...
def register_factory(name: Any = None) -> Any:
    """Class decorator: register under ``name`` (if given), the class name, and the short
    alias without a ``ModificationFactory`` suffix. Usable as ``@register_factory`` or
    ``@register_factory("name")``."""
    if isinstance(name, type):
        return register_factory()(name)
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"register_factory name must be a non-empty string, got {name!r}")

    def decorator(cls: F) -> F:
        if not (isinstance(cls, type) and issubclass(cls, ModificationFactory)):
            raise TypeError(f"@register_factory needs a ModificationFactory subclass, got {cls!r}")
        names = [cls.__name__]
        if name is not None and name != cls.__name__:
            names.insert(0, name)
        if cls.__name__.endswith(_SUFFIX) and len(cls.__name__) > len(_SUFFIX):
            names.append(cls.__name__[: -len(_SUFFIX)])
        for n in names:
            existing = FACTORIES.get(n)
            if existing is not None and not _same_class(existing, cls):
                raise ValueError(f"factory name {n!r} is already registered to {existing.__module__}.{existing.__qualname__}")
        for n in names:
            FACTORIES[n] = cls
        return cls

    return decorator


def _import_factory(spec: str, path: str) -> type[ModificationFactory]:
    module_part, _, attr = spec.rpartition(":")
    if not module_part or not attr:
        raise FactoryConfigError(f"import path must look like 'package.module:Class' or 'file.py:Class', got {spec!r}", path=path)
    try:
        if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
            file = Path(module_part).expanduser().resolve()
            if not file.is_file():
                raise FactoryConfigError(f"cannot import {spec!r}: file {str(file)!r} not found", path=path)
            digest = hashlib.sha1(str(file).encode()).hexdigest()[:10]
            mod_name = f"_modification_factory_user_{file.stem}_{digest}"
            module = sys.modules.get(mod_name)
            if module is None:
                mod_spec = importlib.util.spec_from_file_location(mod_name, file)
                if mod_spec is None or mod_spec.loader is None:
                    raise FactoryConfigError(f"cannot import {spec!r}: not a Python file", path=path)
                module = importlib.util.module_from_spec(mod_spec)
                sys.modules[mod_name] = module  # needed by dataclasses/pickle inside the module
                try:
                    mod_spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[mod_name]
                    raise
        else:
            module = importlib.import_module(module_part)
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except FactoryConfigError:
        raise
    except Exception as exc:  # any import-time failure is a config problem for the user
        raise FactoryConfigError(f"cannot import {spec!r}: {type(exc).__name__}: {exc}", path=path) from exc
    if not _is_factory_class(obj):
        raise FactoryConfigError(
            f"{spec!r} is neither a ModificationFactory subclass nor a class with get_modification(step), "
            f"got {_fmt(obj)}",
            path=path,
        )
    return obj


def _is_factory_class(obj: Any) -> bool:
    """A ModificationFactory subclass, or a seed-style plain class with a ``get_modification`` method."""
    if not isinstance(obj, type):
        return False
    return issubclass(obj, ModificationFactory) or callable(getattr(obj, "get_modification", None))


def _is_seed_style(cls: type) -> bool:
    """Run through :class:`CallReplayFactory`: a plain class, or a subclass overriding only ``get_modification``."""
    if not issubclass(cls, ModificationFactory):
        return True
    return (
        cls.get_modification is not ModificationFactory.get_modification
        and cls.modification_at is ModificationFactory.modification_at
    )


def get_factory_class(name: str, *, path: str = "modification_factory") -> type[ModificationFactory]:
    """Resolve a registered name, short alias, or ``module:Class`` / ``file.py:Class`` import path."""
    if not isinstance(name, str):
        raise FactoryConfigError(f"must be a factory name string, got {_fmt_typed(name)}", path=path)
    cls = FACTORIES.get(name)
    if cls is not None:
        if not _is_factory_class(cls):
            raise FactoryConfigError(
                f"modification_factory_mapping[{name!r}] is neither a ModificationFactory subclass nor a class "
                f"with get_modification(step), got {_fmt(cls)}",
                path=path,
            )
        return cls
    if ":" in name:
        return _import_factory(name, path)
    known = ", ".join(sorted(FACTORIES))
    raise FactoryConfigError(f"unknown factory {name!r}; known: {known}", path=path)


def make_factory(
    name: str | type[ModificationFactory],
    kwargs: dict[str, Any],
    *,
    seed: int = 0,
    granularity: int = 1,
    path: str = DEFAULT_PATH,
    name_path: str = "modification_factory",
) -> ModificationFactory:
    """Validate ``kwargs`` against the factory's signature and construct it."""
    if isinstance(name, type):
        if not _is_factory_class(name):
            raise FactoryConfigError(
                f"{name!r} is neither a ModificationFactory subclass nor a class with get_modification(step)",
                path=name_path,
            )
        cls = name
        spec = FACTORIES.get(name.__name__) is name and name.__name__ or f"{name.__module__}:{name.__qualname__}"
    else:
        cls = get_factory_class(name, path=name_path)
        spec = name
    if not isinstance(kwargs, dict):
        raise FactoryConfigError(f"must be a dict of keyword arguments, got {_fmt_typed(kwargs)}", path=path)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = {
        p.name: p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    fields = sorted(n for n in named if n not in _RESERVED_KWARGS)
    for key in kwargs:
        if not isinstance(key, str):
            raise FactoryConfigError(f"argument names must be strings, got {_fmt_typed(key)}", path=path)
        if key in _RESERVED_KWARGS:
            raise FactoryConfigError(
                "not allowed in the kwargs; seed and granularity are set by the run", path=f"{path}.{key}"
            )
        if key not in named and not accepts_any:
            raise FactoryConfigError(
                f"unknown argument for {cls.__name__}; expected one of: {', '.join(fields)}", path=f"{path}.{key}"
            )
    for field in fields:
        if named[field].default is inspect.Parameter.empty and field not in kwargs:
            raise FactoryConfigError(f"missing required argument for {cls.__name__}", path=f"{path}.{field}")
    extra: dict[str, Any] = {"seed": seed, "granularity": granularity, "_path": path}
    call = dict(kwargs)
    seed_style = _is_seed_style(cls)
    for key, value in extra.items():
        # A seed-style class gets seed/granularity only if it names them (its **kwargs are its own).
        if key in named or (accepts_any and not seed_style):
            call[key] = value
    try:
        if seed_style:
            return CallReplayFactory(cls, spec, kwargs, call, seed=seed, granularity=granularity, _path=path)
        return cls(**call)
    except FactoryConfigError:
        raise
    except (TypeError, ValueError) as exc:  # user constructors: still report a one-line config error
        raise FactoryConfigError(f"{type(exc).__name__}: {exc}", path=path) from exc


# --------------------------------------------------------------------------- #
# Seed-style factories: a plain class with get_modification(step), run by call replay
# --------------------------------------------------------------------------- #
class CallReplayFactory(ModificationFactory):
    """Runs a seed-style factory (``__init__(num_total_steps, **kwargs)``, ``get_modification(step) -> str``,
    possibly stateful, possibly drawing from the global ``random`` / ``np.random``).

    The wrapped object is asked exactly as the training loop asks: once per decision, at the steps
    ``0, granularity, 2 * granularity, ...`` in this order, and the answers are recorded. A step is answered
    from the record, so any call order gives the answers of that in-order sequence; a resumed run builds a
    fresh object and replays the calls from step 0, so it continues the same schedule. Global-RNG draws in
    the user's code use a private ``random`` / ``np.random`` state seeded from the run's seed (the caller's
    global state is saved and restored around every call), so a schedule depends only on (kwargs, seed,
    granularity). What does not hold: other hidden inputs (time, files, torch's RNG) are not replayed.
    """

    def __init__(
        self,
        user_cls: type,
        spec: str,
        kwargs: dict[str, Any],
        call: dict[str, Any],
        *,
        seed: int = 0,
        granularity: int = 1,
        _path: str = DEFAULT_PATH,
    ) -> None:
        if "num_total_steps" not in kwargs:
            raise FactoryConfigError(
                f"missing required argument for {user_cls.__name__}", path=f"{_path}.num_total_steps"
            )
        super().__init__(kwargs["num_total_steps"], seed=seed, granularity=granularity, _path=_path)
        self._user_cls, self._spec = user_cls, spec
        self._user_kwargs, self._call = dict(kwargs), dict(call)
        self._answers: list[int] = []  # code of the answer to call k (at step k * granularity)
        # Seeds may be 64-bit (Combined phases): MT19937 via SeedSequence takes any non-negative int.
        self._rng_states = (
            random.Random(self._seed).getstate(),
            np.random.RandomState(np.random.MT19937(self._seed)).get_state(),
        )
        self._instance = self._with_private_rng(lambda: user_cls(**self._call))
        if not callable(getattr(self._instance, "get_modification", None)):
            raise FactoryConfigError(f"{spec!r} has no get_modification(step) method", path=_path)

    def _with_private_rng(self, fn: Callable[[], Any]) -> Any:
        saved = (random.getstate(), np.random.get_state())
        random.setstate(self._rng_states[0])
        np.random.set_state(self._rng_states[1])
        try:
            return fn()
        finally:
            self._rng_states = (random.getstate(), np.random.get_state())
            random.setstate(saved[0])
            np.random.set_state(saved[1])

    def factory_name(self) -> str:  # type: ignore[override]
        return self._spec

    def config(self) -> dict[str, Any]:
        return _plain(self._user_kwargs)

    def modification_at(self, step: int) -> str:
        k = step // self._granularity
        while len(self._answers) <= k:
            at = len(self._answers) * self._granularity
            try:
                answer = self._with_private_rng(lambda: self._instance.get_modification(at))
            except Exception as exc:  # user code: a one-line config error, not a traceback
                raise FactoryConfigError(
                    f"{self._spec}.get_modification({at}) raised {type(exc).__name__}: {exc}", path=self._path
                ) from exc
            if not isinstance(answer, str):
                raise FactoryConfigError(
                    f"{self._spec}.get_modification({at}) returned {_fmt_typed(answer)}, expected a str",
                    path=self._path,
                )
            self._answers.append(self._intern(normalize_modification(answer)))
        return self._vocab[self._answers[k]]

    def __repr__(self) -> str:
        return (
            f"CallReplayFactory({self._spec}, total_timesteps={self._total}, seed={self._seed}, "
            f"granularity={self._granularity})"
        )


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


# --------------------------------------------------------------------------- #
# Preview CLI
# --------------------------------------------------------------------------- #
def _factory_from_config(
    config: Any, *, granularity: int | None, seed: int | None
) -> tuple[ModificationFactory, str]:
    if not isinstance(config, dict):
        raise FactoryConfigError(f"config must be a JSON object, got {type(config).__name__}")
    if "modification_factory" not in config:
        raise FactoryConfigError("missing in the config", path="modification_factory")
    name = config["modification_factory"]
    kwargs = config.get("modification_factory_kwargs", {})
    if seed is None:
        seed = config.get("seed", 1)
    seed = _check_int(seed, "seed", minimum=0)
    if granularity is not None:
        granularity = _check_int(granularity, "granularity", minimum=1)
        return make_factory(name, kwargs, seed=seed, granularity=granularity), str(name)
    # As training builds it (make_run_factory); the rollout size only matters for your own factories.
    if "num_envs" in config and "num_steps" in config:
        rollout = _check_int(config["num_envs"], "num_envs", minimum=1) * _check_int(
            config["num_steps"], "num_steps", minimum=1
        )
    else:
        rollout = DEFAULT_GRANULARITY
    return make_run_factory(name, kwargs, seed=seed, rollout_size=rollout), str(name)


def _print_preview(factory: ModificationFactory, name: str, max_rows: int) -> None:
    rows: list[tuple[int, int, str]] = []
    n_runs = 0
    for run in factory.iter_schedule():
        n_runs += 1
        if max_rows == 0 or len(rows) < max_rows:
            rows.append(run)
    hidden = n_runs - len(rows)
    possible = factory.possible_modifications()
    header = (
        f"{name}: total {factory.total_timesteps} steps, granularity {factory.granularity}, "
        f"seed {factory.seed}, {max(n_runs - 1, 0)} switches"
    )
    cells = [(str(s), str(e), str(e - s), m or "(none)") for s, e, m in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    if Console is not None:
        widest = max([len(c[3]) for c in cells] + [len(p) for p in possible] + [len(header), 20])
        # Wide enough that long modification strings are never wrapped when piped.
        console = Console(width=None if sys.stdout.isatty() else widest + 60, highlight=False)
        console.print(header, markup=False)
        console.print(granularity_rule(factory), markup=False, soft_wrap=True)
        table = Table()
        for column in ("start", "end", "steps"):
            table.add_column(column, justify="right")
        table.add_column("modification", overflow="fold")
        for cell in cells:
            table.add_row(*cell)
        console.print(table)
        if hidden:
            console.print(f"... {hidden} more rows (use --max-rows 0 to show all)", markup=False)
        console.print(f"possible modifications ({len(possible)}):", markup=False)
        for p in possible:
            console.print(f"  {p or '(none)'}", markup=False)
        return
    print(header)
    print(granularity_rule(factory))
    titles = ("start", "end", "steps", "modification")
    widths = [max([len(t)] + [len(c[i]) for c in cells]) for i, t in enumerate(titles)]
    print("  ".join(t.rjust(w) if i < 3 else t for i, (t, w) in enumerate(zip(titles, widths))))
    for cell in cells:
        print("  ".join(c.rjust(w) if i < 3 else c for i, (c, w) in enumerate(zip(cell, widths))))
    if hidden:
        print(f"... {hidden} more rows (use --max-rows 0 to show all)")
    print(f"possible modifications ({len(possible)}):")
    for p in possible:
        print(f"  {p or '(none)'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="modification_factories.py",
        description="Preview the modification schedule of a training config.",
    )
    parser.add_argument("config", help="JSON file with modification_factory and modification_factory_kwargs")
    parser.add_argument("--granularity", type=int, default=None, help="steps per decision (default num_envs*num_steps, else 1024)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: the config's seed, else 1)")
    parser.add_argument("--max-rows", type=int, default=200, help="table rows to print, 0 for all (default 200)")
    args = parser.parse_args(argv)
    try:
        if args.max_rows < 0:
            raise FactoryConfigError(f"must be >= 0, got {args.max_rows}", path="--max-rows")
        try:
            with open(args.config, encoding="utf-8") as fh:
                config = json.load(fh)
        except OSError as exc:
            raise FactoryConfigError(f"cannot read config: {exc.strerror or exc}", path=args.config) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FactoryConfigError(f"invalid JSON: {exc}", path=args.config) from exc
        factory, name = _factory_from_config(config, granularity=args.granularity, seed=args.seed)
        _print_preview(factory, name, args.max_rows)
    except (FactoryConfigError, ValueError, TypeError) as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Run via the importable module so user factories subclass the same ModificationFactory.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import modification_factories as _module

    sys.exit(_module.main())
