"""The factory contract: modification strings, argument validators, private random streams and the
`ModificationFactory` base class (a pure map from the global step to a modification string)."""

from __future__ import annotations

import inspect
import math
from abc import ABC
from collections import OrderedDict
from typing import Any, Iterator

import numpy as np

from continual.modstrings import normalize_modification

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

# name -> class; filled by `register_factory` (continual.curricula.registry) and by users
FACTORIES: dict[str, type] = {}

_UNSET: Any = object()  # "no num_total_steps given" (None must still be rejected)

# Stream tags keep the random streams of one seed independent.
_TAG_RANDOM = 0
_TAG_EPS_SEQUENTIAL = 1
_TAG_EPS_COMBINED = 2


# --------------------------------------------------------------------------- #
# Normalisation and errors
# --------------------------------------------------------------------------- #
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
