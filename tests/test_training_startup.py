"""continual.training.startup: process settings a training run makes before its first env."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# glibc's own account of the heap (mallinfo2, glibc >= 2.33) around the allocation a PPO minibatch makes on CPU
# (256 Nature-CNN frames as float32: 29 MB), then freed. Prints: applied, mmapped bytes while the block lives, heap
# bytes after it was freed.
HEAP_PROBE = """
import ctypes, sys
import torch
sys.path.insert(0, {root!r})
from continual.training.startup import retain_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = retain_freed_memory() if sys.argv[1] == "retain" else None
batch = torch.empty((256, 4, 84, 84), dtype=torch.float32)
mmapped = libc.mallinfo2().hblkhd
del batch
print(applied, mmapped, libc.mallinfo2().arena)
"""
BATCH = 256 * 4 * 84 * 84 * 4


def probe(mode: str, env: dict) -> tuple[str, int, int]:
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE.format(root=ROOT), mode], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_retained_memory_keeps_a_minibatch_in_the_heap_across_frees():
    """glibc's documented defaults: a fresh process maps a 29 MB block with mmap (128 KB threshold), so freeing it
    unmaps it and the next batch is faulted in anew. With the setting the block comes from the heap and the heap keeps
    it after the free (no trim). (Whether the next batch reuses it also depends on what else allocates in between, so
    the page faults themselves are measured in bench/RESULTS.md, not here.) A malloc setting of the user's is left
    alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD",
                                                                                              "GLIBC_TUNABLES")}
    applied, mmapped, _ = probe("plain", env)
    assert applied == "None" and mmapped >= BATCH
    applied, mmapped, heap_after_free = probe("retain", env)
    assert applied == "True"
    assert mmapped < BATCH
    assert heap_after_free >= BATCH
    applied, *_ = probe("retain", {**env, "MALLOC_ARENA_MAX": "2"})
    assert applied == "False"


# --- the start of a run: a short summary, every setting in config.json ---------------------------------------------

def _cartpole(tmp, *flags: str) -> subprocess.CompletedProcess:
    from conftest import run_main

    return run_main("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium",
                    "--num_envs", "2", "--num_steps", "64", "--total_timesteps", "100", "--runs_dir",
                    str(tmp / "runs"), "--no-progress-bar", *flags)


def test_a_run_starts_with_a_short_summary_and_keeps_every_setting_in_config_json(tmp_path):
    """One iteration prints at most 30 lines (it printed 157 with every setting): the architecture, game, device in
    use, the resolved length, the curriculum and the settings that differ from the defaults; no DQN, HER or EWC flag
    of a PPO run. config.json holds every setting; --verbose prints them too."""
    import json

    import torch

    proc = _cartpole(tmp_path, "--run_name", "quiet", "--learning_rate", "1e-3")
    lines = proc.stdout.splitlines()
    assert len(lines) <= 30, proc.stdout
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert lines[0] == f"PPO on CartPole-v1 (Gymnasium), seed 1, device {device}"
    assert "steps: 128 (1 iteration of 128 steps, 2 envs)" in lines  # 100 asked, rounded up to one rollout
    assert "learning_rate=0.001" in proc.stdout and "total_timesteps=100" in proc.stdout
    for absent in ("buffer_size", "her_", "ewc", "cuda", "resolved configuration", "= None"):
        assert absent not in proc.stdout, absent
    config = json.load(open(tmp_path / "runs" / "quiet" / "config.json"))
    assert config["learning_rate"] == 1e-3 and "buffer_size" in config and config["resolved_total_timesteps"] == 128

    verbose = _cartpole(tmp_path, "--run_name", "loud", "--verbose").stdout
    assert "resolved configuration:" in verbose and "buffer_size" in verbose
    assert len(verbose.splitlines()) > len(config) - 5


def test_the_summary_lists_what_differs_from_the_architectures_resolved_defaults():
    from continual.config.loading import Curriculum
    from continual.training.startup import parse_train_args, preflight, run_summary

    args, curriculum, _ = parse_train_args(["--architecture", "DQN", "--env_id", "CartPole-v1", "--backend",
                                            "Gymnasium", "--total_timesteps", "500", "--runs_dir", "/nonexistent/r"])
    plan = preflight(args, curriculum)
    text = "\n".join(run_summary(args, Curriculum(), plan))
    # DQN's own defaults (1 env, lr 1e-4) and what the run resolves (exp_name, clip, reward scaling) are not news
    for absent in ("num_envs", "learning_rate", "exp_name", "max_grad_norm", "reward_scaling", "run_name"):
        assert absent not in text, absent
    assert "total_timesteps=500" in text and "runs_dir='/nonexistent/r'" in text
    assert "steps: 512 (4 iterations of 128 steps, 1 env)" in text


@pytest.mark.parametrize("act_threads, inside", [(1, 1), (0, 2), (2, 2)])
def test_acting_threads_sets_the_rollouts_threads_and_gives_the_update_its_own_back(act_threads, inside):
    import torch

    from continual.config.args import Args
    from continual.training.startup import acting_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with acting_threads(Args(act_threads=act_threads)):
            assert torch.get_num_threads() == inside
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
