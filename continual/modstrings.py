"""Modification strings ("all_green_cars stop_all_cars"): their canonical form, one definition for envs, curricula,
evaluation and metrics. Whitespace-separated tokens, empties dropped, de-duplicated, sorted, joined by one space;
"" is the unmodified game."""

from __future__ import annotations

from typing import Sequence


def modification_tokens(modification: str | Sequence[str]) -> list[str]:
    """The sorted unique tokens of a modification string, or of a list of strings (each split on whitespace)."""
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
    """Canonical form: whitespace-split, drop empties, de-duplicate, sort, join with one space."""
    return " ".join(modification_tokens(modification))


def parse_eval_modifs(text: str) -> list[str]:
    """`--eval_modifs`: modification strings separated by ';' ("" -> none; an empty item is the unmodified game)."""
    if not text or not text.strip():
        return []
    out: list[str] = []
    for item in text.split(";"):
        m = normalize_modification(item)
        if m not in out:
            out.append(m)
    return out
