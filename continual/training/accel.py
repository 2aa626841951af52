"""--compile and --cudagraphs (PPO): the act step and the update's forward pass + loss through `torch.compile`, and on
CUDA replayed as CUDA graphs, LeanRL's approach (github.com/pytorch-labs/LeanRL: CleanRL + torch.compile + CUDA
graphs). The default (neither flag) returns the function itself: the eager run is untouched.

- `--compile`: TorchInductor compiles each step as one graph (`fullgraph=True`: a construct dynamo cannot trace is an
  error, never a silent split into eager pieces); AOTAutograd compiles the loss's backward with it. Random draws
  (the act step's `torch.multinomial`) come from torch's generator as in eager, so a seed plays the same games; the
  numbers equal eager's to float rounding (tests/test_training_accel.py). The optimizer step, gradient clipping and
  the continual extensions' hooks stay eager (foreach kernels: a few launches for all parameters).
- `--cudagraphs` (CUDA, static shapes): `mode="reduce-overhead"`, CUDA-graph trees: each step is recorded once per
  input shape and replayed, removing the per-kernel launch cost that dominates small networks on a GPU. A graph's
  outputs live in a pool that its next replay overwrites, so callers copy what they keep past the next call
  (PPO copies the act step's outputs into its rollout storage and reads the losses before the next minibatch).
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

from continual.config.args import Args

F = TypeVar("F", bound=Callable)


def compile_step(fn: F, args: Args) -> F:
    """`fn` as the run's flags ask: itself (eager, the default), compiled (--compile), or compiled and replayed as
    CUDA graphs (--cudagraphs)."""
    if not args.compile:
        return fn
    if not args.cudagraphs:
        return torch.compile(fn, fullgraph=True)
    compiled = torch.compile(fn, fullgraph=True, mode="reduce-overhead")

    def replayed(*a, **kw):
        # every call is a new step of the graph trees: the previous call's outputs (already copied or read) may go
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*a, **kw)

    return replayed  # type: ignore[return-value]
