"""Which code an experiment's runs run: a folder pinned to a git revision of this repository, run from a worktree of
it, so that runs resumed over many sessions (or on a new machine, from their carry) keep training with the code they
started with while the checkout moves on.

    python -m continual.launch EXPERIMENT.json --code c127f01     # pin the folder; its runs run c127f01's script
    python -m continual.launch EXPERIMENT.json                    # later launches: the pinned revision again
    python -m continual.launch EXPERIMENT.json --code 91410b3 --code_change   # move the pin (a bug fix), recorded

The worktree is `$XDG_CACHE_HOME/continual/code/<commit>` (default `~/.cache`), made with `git worktree add --detach`
when missing; the runs run its `continual_training_example.py` (or the experiment's "script", at the same path
inside it), and a run's child process imports that worktree's `continual` (the launcher puts the script's folder
first on PYTHONPATH), so its start records name the pinned commit (continual/training/provenance.py).

The pin is the `code` list of the folder's declarations record (continual/launch/declarations.py), which travels with
the archive and the carry (the newest of the three lists counts: pins_of): a launch of a pinned folder runs the pin, and one that would run other code (another
--code, or a --script whose checkout is not the pinned commit with its tracked files unchanged) is refused in one line,
exit 2, before anything is written, unless --code_change appends the new revision to the list (with --script, its
checkout's commit; none, which unpins the folder, for a checkout with changed files or no checkout). A folder without
a pin runs --script or the current checkout as before.
"""

from __future__ import annotations

import os
import subprocess
from typing import Iterable, Optional, Sequence

from continual.errors import UserError
from continual.training.provenance import code_revision

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the library's checkout
KEY = "code"  # the declarations record's list of pins: [{"commit", "recorded", "change"}], the last one current


def _git(cwd: str, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise UserError(f"code: git could not run ({e})") from None


def resolve(rev: str, repo: Optional[str] = None) -> str:
    """The full commit `rev` names in the library's checkout (bad input: a UserError)."""
    repo = repo or REPO
    if not os.path.exists(os.path.join(repo, ".git")):
        raise UserError(f"code: {repo!r} is not a git checkout (the library was installed without one), so no "
                        f"revision can be pinned; run from a clone")
    p = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if p.returncode != 0 or not p.stdout.strip():
        raise UserError(f"code: {rev!r} is no commit of the checkout {repo!r} (git fetch it, or name another)")
    return p.stdout.strip()


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "continual", "code")


def worktree_path(commit: str) -> str:
    return os.path.join(cache_dir(), commit)


def _is_clean_at(path: str, commit: str) -> bool:
    rev = code_revision(path)
    return rev is not None and rev["commit"] == commit and not rev["dirty"]


def worktree(commit: str, repo: Optional[str] = None) -> str:
    """The worktree of `commit` (made if missing); an existing folder there must be that commit, unchanged."""
    repo = repo or REPO
    path = worktree_path(commit)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _git(repo, "worktree", "prune")  # a worktree deleted by hand (or lost with its machine) is still registered
        p = _git(repo, "worktree", "add", "--detach", path, commit)
        if p.returncode != 0 and not _is_clean_at(path, commit):  # another launcher may have made it meanwhile
            raise UserError(f"code: git worktree add {path} {commit[:12]} failed: "
                            f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    if not _is_clean_at(path, commit):
        raise UserError(f"code: {path!r} is not the worktree of {commit[:12]} with its tracked files unchanged: "
                        f"remove it (git worktree remove --force {path}) and launch again")
    return path


def script_in(tree: str, script: Optional[str], default: str) -> str:
    """The training script at its place inside the worktree: the experiment's "script" by its path from the
    library's checkout, else `default` (continual_training_example.py)."""
    if script is None:
        return os.path.join(tree, default)
    rel = os.path.relpath(os.path.realpath(script), os.path.realpath(REPO))
    if rel.startswith(os.pardir):
        raise UserError(f"code: the experiment's script {script!r} is outside the checkout {REPO!r}, so no revision "
                        f"of it can be pinned; drop --code or move the script into the repository")
    return os.path.join(tree, rel)


def pins_of(records: Iterable[Optional[dict]]) -> list[dict]:
    """The pins of the newest of a folder's records (its own, its archive's, its carry's): the longest list, as each
    is the folder's list when it was copied and the list only grows (an archive written before the pin moved is
    behind the carry written after)."""
    return max(((r or {}).get(KEY) or [] for r in records), key=len, default=[])


def pinned(pins: Sequence[dict]) -> Optional[str]:
    """The commit the runs are pinned to (None: not pinned)."""
    return pins[-1]["commit"] if pins else None


def choose(pins: Sequence[dict], code: Optional[str], script: Optional[str], change: bool) -> Optional[str]:
    """The commit this launch runs from a worktree (None: the given or found script, as without a pin), after
    refusing a launch that would run other code than the folder's pin without --code_change.

    `code`: --code; `script`: --script (mutually exclusive with --code); `pins`: the folder's (pins_of)."""
    if code is not None and script is not None:
        raise UserError("code: --code runs the script of a worktree; drop --script (the experiment's \"script\" is "
                        "taken at the same place inside the worktree)")
    pin = pinned(pins)
    if code is not None:
        commit = resolve(code)
        if pin is not None and commit != pin and not change:
            raise UserError(f"code: this folder's runs are pinned to {pin[:12]}; --code {code} ({commit[:12]}) would "
                            f"resume them with other code: pass --code_change to move the pin (recorded), or drop "
                            f"--code")
        return commit
    if pin is None:
        return None
    if script is not None:
        if _is_clean_at(os.path.dirname(os.path.abspath(script)), pin) or change:
            return None
        raise UserError(f"code: this folder's runs are pinned to {pin[:12]} and --script {script} is not that "
                        f"revision with its tracked files unchanged: drop --script (the pin's worktree runs), or pass "
                        f"--code_change to run it (recorded)")
    return pin


def updated(record: dict, pins: Sequence[dict], commit: Optional[str], script: str, now: str) -> dict:
    """`record` with the folder's pins (pins_of), this launch's appended when it moves: --code, or a --code_change
    onto a script (its checkout's commit, None for no clean checkout)."""
    pin = pinned(pins)
    if commit is None and pin is not None:
        rev = code_revision(os.path.dirname(os.path.abspath(script)))
        commit = rev["commit"] if rev and not rev["dirty"] else None
    if commit != pin:
        pins = [*pins, {"commit": commit, "recorded": now, "change": pin is not None}]
    return {**record, KEY: list(pins)} if pins else record
