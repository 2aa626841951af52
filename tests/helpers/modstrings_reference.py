"""A frozen copy of the modification-string tokenizer as it was before tasks were parsed once (continual.modstrings
and continual.envs.backends at da56a98): the reference tests/test_modstrings.py compares the parser against. Do not
change it to follow the library."""

from __future__ import annotations

from typing import Optional, Sequence

ENV_TOKEN = "env="


class ReferenceError_(Exception):
    """The reference's UserError (compared by message)."""


def modification_tokens(modification: str | Sequence[str]) -> list[str]:
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
    return sorted(set(tokens))


def normalize_modification(modification: str | Sequence[str]) -> str:
    return " ".join(modification_tokens(modification))


def parse_eval_modifs(text: str) -> list[str]:
    if not text or not text.strip():
        return []
    out: list[str] = []
    for item in text.split(";"):
        m = normalize_modification(item)
        if m not in out:
            out.append(m)
    return out


def split_task(modification: str) -> tuple[Optional[str], str]:
    envs = [t[len(ENV_TOKEN):] for t in modification_tokens(modification) if t.startswith(ENV_TOKEN)]
    if len(envs) > 1:
        raise ReferenceError_(f"modification {modification!r} names {len(envs)} environments ({', '.join(envs)}); "
                              f"a task has one")
    if envs and not envs[0]:
        raise ReferenceError_(f"modification {modification!r}: 'env=' needs an env id, e.g. env=MinAtar/Breakout")
    rest = " ".join(t for t in modification_tokens(modification) if not t.startswith(ENV_TOKEN))
    return (envs[0] if envs else None), rest


def task_env_ids(default_env_id: str, modifications: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({split_task(m)[0] or default_env_id for m in modifications}))


def game_name(env_id: str) -> str:
    name = env_id.split("/")[-1].split("-")[0]
    for suffix in ("NoFrameskip", "Deterministic"):
        name = name.replace(suffix, "")
    return name


def parameters(modification: str) -> list[tuple[str, str, str]]:
    """(name, '=', value) of each token, as the MinAtar and Gymnasium parsers partitioned them."""
    return [tok.partition("=") for tok in modification_tokens(modification)]
