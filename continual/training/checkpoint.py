"""Checkpoints (`.cleanrl_model`): everything needed to resume a run and to evaluate it.

A checkpoint is a dict of tensors and plain Python values, written atomically (temporary file, fsync, rename) and
read with `torch.load(..., weights_only=True)`, so loading never runs pickled code.

A run directory given for a checkpoint (`--resume RUN_DIR`, `eval.py RUN_DIR`) means its newest *valid* checkpoint:
newer ones that are corrupt or truncated (a partial copy between machines, bit rot) are skipped with one warning line
(`--resume` also renames them to `<name>.corrupt`, out of the way of the resumed run). A corrupt file named
explicitly, or a run whose checkpoints are all corrupt, is a UserError (exit 2).
"""

from __future__ import annotations

import copy
import glob
import os
import pickle
import random
import re
import sys
import zipfile
from typing import Any, Optional

import numpy as np
import torch

from continual.config.args import field_names
from continual.config.loading import load_json_file
from continual.errors import TrainingError, UserError
from continual.io import TMP_PREFIX, atomic_open, storage_errors

CORRUPT_SUFFIX = ".corrupt"  # a skipped corrupt checkpoint, renamed by --resume
FORMAT_VERSION = 1
LIBRARY_VERSION = "0.1.0"
SUFFIX = ".cleanrl_model"
CHECKPOINT_DIR = "checkpoints"  # <run>/checkpoints/*.cleanrl_model
REQUIRED_KEYS = ("format_version", "architecture", "args", "model", "global_step")
RESUME_KEYS = ("curriculum", "factory_state", "rng", "modification", "optimizer")


def rng_state(np_rng: Optional[np.random.Generator] = None) -> dict:
    """Torch, Python and (our) numpy generator states as checkpoint-safe values."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": _to_plain(random.getstate())}
    if np_rng is not None:
        state["numpy"] = np_rng.bit_generator.state
    return state


def restore_rng_state(state: dict, np_rng: Optional[np.random.Generator] = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuple(state["python"]))
    if np_rng is not None and "numpy" in state:
        np_rng.bit_generator.state = state["numpy"]


def _to_plain(x: Any) -> Any:
    return [_to_plain(v) for v in x] if isinstance(x, (tuple, list)) else x


def _to_tuple(x: Any) -> Any:
    return tuple(_to_tuple(v) for v in x) if isinstance(x, list) else x


# What torch.load(weights_only=True) reads back (numpy values are refused, and np.float64 is a float: tested first)
_PLAIN = (torch.Tensor, bool, int, float, complex, str, bytes, bytearray, type(None), torch.dtype, torch.device,
          torch.Size)


def plain(x: Any, where: str = "checkpoint") -> Any:
    """`x` with numpy scalars turned into Python values (containers copied only where one changed); any other value
    that `load_checkpoint` would refuse is a TrainingError here, at the save, not at a resume hours later."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, dict):
        items = [(plain(k, f"{where} key {k!r}"), plain(v, f"{where}[{k!r}]")) for k, v in x.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, x.items())):
            return x
        out = copy.copy(x)  # keeps the type and a state_dict's _metadata
        out.clear()
        out.update(items)
        return out
    if type(x) in (list, tuple, set):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(x)]
        return x if all(v is v0 for v, v0 in zip(items, x)) else type(x)(items)
    raise TrainingError(f"{where} is a {type(x).__module__}.{type(x).__qualname__}, which a checkpoint cannot hold "
                        f"(loading reads only tensors and plain Python values)")


def save_checkpoint(path: str, payload: dict) -> str:
    """Write atomically: a crash mid-write leaves the previous file (or none), never a truncated one."""
    payload = plain({"format_version": FORMAT_VERSION, "library_version": LIBRARY_VERSION, **payload})
    try:
        with storage_errors(path):  # a full disk: StorageError (the temporary file is gone, the previous one intact)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with atomic_open(path, "wb") as f:
                torch.save(payload, f)
    except OSError as e:
        raise TrainingError(f"cannot write checkpoint {path}: {e.strerror or e}") from None
    return path


class CorruptCheckpoint(UserError):
    """The file is not a readable checkpoint: empty, truncated, damaged or another kind of file."""


def load_checkpoint(path: str, expect_architecture: Optional[str] = None) -> dict:
    """Load with weights_only=True; every failure is a one-line UserError. A run directory: its newest valid
    checkpoint (see the module docstring); the newer corrupt ones it skipped are listed under "skipped_corrupt"."""
    if os.path.isdir(path):
        path, data, skipped = newest_valid(path)
        data = _check(data, path, expect_architecture)
        data["skipped_corrupt"] = skipped
        return data
    return _check(_read(path), path, expect_architecture)


def _read(path: str) -> Any:
    if not os.path.exists(path):
        raise UserError(f"checkpoint {path!r} does not exist")
    if os.path.getsize(path) == 0:
        raise CorruptCheckpoint(f"checkpoint {path!r} is empty")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not ours
        raise CorruptCheckpoint(f"checkpoint {path!r} is not a PyTorch checkpoint (corrupt, truncated or another kind "
                                f"of file)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(f"checkpoint {path!r} refused: it holds objects other than tensors and plain values, which "
                        f"could run code when loaded") from None
    except Exception as e:  # a damaged archive surfaces as many exception types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(f"checkpoint {path!r} is corrupt or truncated ({first})") from None
    return data


def newest_valid(run_dir: str) -> tuple[str, Any, list[str]]:
    """(path, contents, skipped) for the newest checkpoint of `run_dir` that reads; the newer corrupt ones (`skipped`)
    are named in one warning line on stderr. None reads: a UserError."""
    files = checkpoints_newest_first(run_dir)
    if not files:
        raise UserError(f"run directory {run_dir!r} has no checkpoints")
    bad: list[str] = []
    for f in files:
        try:
            data = _read(f)
        except CorruptCheckpoint:
            bad.append(f)
            continue
        if bad:
            step = data.get("global_step") if isinstance(data, dict) else None
            print(f"warning: skipped corrupt or truncated checkpoint{'s' if len(bad) > 1 else ''} "
                  f"{', '.join(map(os.path.basename, bad))}; using {f}" + (f" (step {step})" if step is not None
                                                                           else ""), file=sys.stderr)
        return f, data, bad
    raise UserError(f"run directory {run_dir!r}: all {len(bad)} checkpoints are corrupt or truncated "
                    f"({', '.join(map(os.path.basename, bad))})")


def set_aside_corrupt(paths: list[str]) -> None:
    """Rename skipped corrupt checkpoints to `<name>.corrupt` (kept for inspection, out of the resumed run's way)."""
    for p in paths:
        if os.path.exists(p):
            os.replace(p, p + CORRUPT_SUFFIX)


def looks_complete(path: str) -> bool:
    """A cheap check (no tensor is read) that a checkpoint file is a whole zip archive: false for an empty,
    truncated or foreign file. A file that passes may still fail to load (damage inside the archive)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("data.pkl") for n in z.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _check(data: Any, path: str, expect_architecture: Optional[str]) -> dict:
    if not isinstance(data, dict) or any(k not in data for k in REQUIRED_KEYS):
        raise UserError(f"checkpoint {path!r} is not a continual-hackatari checkpoint (missing keys)")
    if data["format_version"] != FORMAT_VERSION:
        raise UserError(f"checkpoint {path!r} has format version {data['format_version']}, this library reads "
                        f"{FORMAT_VERSION}")
    expected_types = {"architecture": str, "args": dict, "model": dict, "global_step": int}
    for key, tp in expected_types.items():
        if not isinstance(data[key], tp) or isinstance(data[key], bool):
            raise UserError(f"checkpoint {path!r}: field {key!r} should be {tp.__name__}, got {type(data[key]).__name__}")
    if data["args"].get("architecture", data["architecture"]) != data["architecture"]:
        raise UserError(f"checkpoint {path!r} is inconsistent: it says {data['architecture']} but was trained as "
                        f"{data['args'].get('architecture')}")
    if expect_architecture is not None and data["architecture"] != expect_architecture:
        raise UserError(f"checkpoint {path!r} holds a {data['architecture']} agent, not {expect_architecture}")
    data["path"] = path
    data["run_dir"] = run_dir_of(path)
    return data


def run_dir_of(path: str) -> str:
    """The run directory of a checkpoint (<run>/checkpoints/x) or of a final policy file (<run>/<exp_name>...)."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(folder) if in_checkpoint_dir(path) else folder


def in_checkpoint_dir(path: str) -> bool:
    """True for <somewhere>/checkpoints/<file>, where a run keeps its checkpoints."""
    return os.path.basename(os.path.dirname(os.path.abspath(path))) == CHECKPOINT_DIR


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR)


def final_policy_path(run_dir: str, args: Any) -> str:
    """Where a finished run leaves its policy the way CleanRL does: runs/<run_name>/<exp_name>.cleanrl_model."""
    return os.path.join(run_dir, (args.exp_name or args.architecture.lower()) + SUFFIX)


def save_state_dict(path: str, state_dict: dict) -> str:
    """The policy alone (a plain state_dict, loadable with `agent.load_state_dict(torch.load(path))`), atomically."""
    with storage_errors(path), atomic_open(path, "wb") as f:
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, f)
    return path


def load_policy_file(path: str) -> dict:
    """A checkpoint, a run directory (its newest checkpoint) or a final policy file (a plain state_dict); the
    latter gets architecture, args and regimes from the run's config.json next to it."""
    if os.path.isdir(path):
        path, data, _ = newest_valid(path)
    else:
        data = _read(path)
    if not (isinstance(data, dict) and data and "format_version" not in data
            and all(isinstance(v, torch.Tensor) for v in data.values())):
        return _check(data, path, None)

    run_dir = run_dir_of(path)
    config_path = os.path.join(run_dir, "config.json")
    if not os.path.exists(config_path):
        raise UserError(f"{path!r} is a plain state_dict (a final policy): its run's config.json, which describes "
                        f"the agent, should be next to it and is not ({config_path!r} does not exist)")
    config = load_json_file(config_path, "run config")
    if not isinstance(config.get("architecture"), str):
        raise UserError(f"run config {config_path!r} has no architecture")
    finals = glob.glob(os.path.join(checkpoint_dir(run_dir), "final__step*" + SUFFIX))
    step = max(map(step_of, finals)) if finals else int(config.get("resolved_total_timesteps") or 0)
    names = field_names()
    return {"architecture": config["architecture"], "args": {k: v for k, v in config.items() if k in names},
            "model": data, "global_step": step, "regimes": config.get("possible_modifications") or [],
            "path": path, "run_dir": run_dir}


def checkpoints_newest_first(run_dir: str) -> list[str]:
    """The checkpoints of a run directory, newest first (by global step, then modification time)."""
    files = glob.glob(os.path.join(checkpoint_dir(run_dir), "*" + SUFFIX))
    return sorted(files, key=lambda f: (step_of(f), os.path.getmtime(f)), reverse=True)


def latest_checkpoint(run_dir: str) -> str:
    """The newest checkpoint file of a run directory (valid or not; see `newest_valid`)."""
    files = checkpoints_newest_first(run_dir)
    if not files:
        raise UserError(f"run directory {run_dir!r} has no checkpoints")
    return files[0]


def newest_whole(run_dir: str) -> Optional[str]:
    """The newest checkpoint of `run_dir` that looks whole (`looks_complete`): the one --resume takes, unless it is
    damaged inside (None: no such checkpoint)."""
    return next((f for f in checkpoints_newest_first(run_dir) if looks_complete(f)), None)


def newest_whole_step(run_dir: str) -> Optional[int]:
    """The step of `newest_whole(run_dir)`, None without one."""
    path = newest_whole(run_dir)
    return None if path is None else step_of(path)


def step_of(path: str) -> int:
    """The step in a checkpoint's name (`periodic__step1024...`), -1 for a name without one."""
    m = re.search(r"step(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else -1


def remove_partial_writes(folder: str) -> None:
    """Temporary files of writes cut by a crash (the previous checkpoints are intact)."""
    for f in glob.glob(os.path.join(folder, TMP_PREFIX + "*" + SUFFIX)):
        os.unlink(f)


def prune_periodic(folder: str, keep: int) -> None:
    """Keep the `keep` newest periodic checkpoints; switch and final checkpoints are never removed."""
    files = sorted(glob.glob(os.path.join(folder, "periodic__step*" + SUFFIX)), key=step_of)
    for f in files[:-keep] if keep > 0 else files:
        os.unlink(f)
