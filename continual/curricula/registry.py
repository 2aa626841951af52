"""Factories by name: the registry (`FACTORIES`, also the seed's `modification_factory_mapping`), import paths,
construction from a config, and the adapter that runs a seed-style plain class (`CallReplayFactory`)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import random
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar, overload

import numpy as np

from continual.curricula.base import (
    _RESERVED_KWARGS,
    _SUFFIX,
    DEFAULT_PATH,
    FACTORIES,
    FactoryConfigError,
    ModificationFactory,
    _fmt,
    _fmt_typed,
    _plain,
    normalize_modification,
)

# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #
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
