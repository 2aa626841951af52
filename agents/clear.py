"""CLEAR (Rolnick et al. 2019, "Experience Replay for Continual Learning"): IMPALA plus a reservoir replay buffer of
unrolls and behaviour cloning on the replayed part of every batch.

    python continual_training_example.py --config configs/impala_cartpole.json --architecture CLEAR \
        --clear_buffer_frames 100000 --clear_replay_fraction 0.5

The actors, V-trace learner, checkpoints and evaluation are `agents/impala.py`'s; this file is the learner extension
it calls (`impala.train(..., make_extension=Clear)`), read top to bottom in an update:
1. `extend_batch`: the batch's B new single-env unrolls (batch_size x envs per actor) are kept aside, and R replayed
   unrolls, drawn uniformly with replacement from the buffer, join them as extra columns (R = B f / (1 - f) for
   --clear_replay_fraction f; CORA's default batch_replay_ratio 1.0 is f = 0.5). Until the first update has been
   committed the buffer is empty and the replayed part repeats the new unrolls;
2. IMPALA's loss on all B + R columns: V-trace corrects the replayed ones with their stored behaviour logits;
3. `loss`: + --clear_policy_cloning * KL(stored behaviour policy || current policy) + --clear_value_cloning *
   (V(x_t) - stored behaviour value)^2, both summed over the replayed steps (as IMPALA's losses and CORA's);
4. `commit` (after the optimizer step): the new unrolls enter the buffer by reservoir sampling (Vitter's algorithm R:
   the n-th unroll ever seen takes a free slot, or replaces a uniformly drawn slot with probability capacity / n), so
   the buffer is a uniform sample of everything seen, whatever the task, and CLEAR never needs task boundaries.
   A crash before the commit leaves the buffer as the last completed update saw it.

The buffer: --clear_buffer_frames // --unroll_length unrolls of T+1 observations (uint8 frames stay uint8, anything
else is float32), T actions, behaviour logits, scaled rewards, dones and behaviour values (recorded by the actors),
and the regime index. It is always disk-backed: one preallocated .npy memory map per field under <run>/replay (the
page cache keeps what fits in memory; preallocation makes a full disk fail at the start, never inside a write to the
map). The learner alone reads and writes it (CORA inserted from the actor processes under a thread lock that did
not lock across processes). Checkpoints hold the filled part and the sampler's RNG state, so a resume continues with
the same buffer; `continual.training.startup.preflight` refuses a buffer that, with one checkpoint copy, does not fit
on the disk.

Deviations from CORA (continual_rl/policies/clear): one buffer instead of one shard per actor; Algorithm R instead of
random keys (the same distribution: a uniform sample); the cloning losses use exactly the replayed part of the batch
trained on (CORA passed it through a queue with a timeout, and could pair it with another batch or skip it); the
cloning targets are the replayed step's own behaviour logits and value (CORA compares the current output at step t
with the stored output of step t-1: TorchBeast stores the agent's output one index after its input).

Spec (continual/specs.py):
- its own defaults: --learning_rate 0.0006 --max_grad_norm 40.0
- supports: actors, clear_replay, mlp_network, network_options, plasticity, shrink_and_perturb
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

if __package__ in (None, ""):  # `python agents/clear.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
import torch.nn.functional as F
from numpy.lib.format import open_memmap

from agents import impala
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.config.validation import clear_replay_count
from continual.errors import TrainingError
from continual.training.extensions import Extension
from continual.training.session import RunSession
from continual.training.startup import agent_main

make_agent = impala.make_agent  # the same network: eval.py loads CLEAR checkpoints as IMPALA ones


class ReservoirReplay:
    """Whole unrolls of one env in .npy memory maps under `folder`, filled by reservoir sampling (Algorithm R)."""

    def __init__(self, folder: str, capacity: int, unroll_length: int, obs_shape: Sequence[int], obs_dtype,
                 n_actions: int, seed: int):
        T = unroll_length
        self.capacity, self.seen = capacity, 0
        self.rng = np.random.default_rng(seed)
        self.fields = {"obs": ((T + 1, *obs_shape), obs_dtype), "action": ((T,), np.int64),
                       "logits": ((T, n_actions), np.float32), "reward": ((T,), np.float32),
                       "done": ((T,), np.bool_), "value": ((T,), np.float32), "regime": ((), np.int64)}
        os.makedirs(folder, exist_ok=True)
        self.data: dict[str, np.ndarray] = {}
        for k, (shape, dtype) in self.fields.items():
            path = os.path.join(folder, f"{k}.npy")
            self.data[k] = open_memmap(path, mode="w+", dtype=dtype, shape=(capacity, *shape))
            try:  # reserve the blocks now: a full disk is an error here, not a SIGBUS at some later write
                with open(path, "r+b") as f:
                    os.posix_fallocate(f.fileno(), 0, os.path.getsize(path))
            except OSError as e:
                raise TrainingError(f"cannot allocate the CLEAR replay buffer {path}: {e.strerror or e}") from None

    def __len__(self) -> int:
        return min(self.seen, self.capacity)

    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.data.values())

    def insert(self, items: dict[str, np.ndarray]) -> None:
        """Algorithm R, item by item: item n (1-based) is kept with probability capacity / n."""
        for i in range(len(items["regime"])):
            if self.seen < self.capacity:
                slot = self.seen
            else:
                slot = int(self.rng.integers(0, self.seen + 1))
            self.seen += 1
            if slot < self.capacity:
                for k, v in self.data.items():
                    v[slot] = items[k][i]

    def sample(self, count: int) -> dict[str, np.ndarray]:
        """`count` stored unrolls drawn uniformly with replacement (sorted slots: the map is read in order)."""
        idx = np.sort(self.rng.integers(0, len(self), size=count))
        return {k: v[idx] for k, v in self.data.items()}

    def state_dict(self) -> dict:
        n = len(self)
        return {"capacity": self.capacity, "seen": self.seen, "rng": self.rng.bit_generator.state,
                "data": {k: torch.from_numpy(np.asarray(v[:n])) for k, v in self.data.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise TrainingError(f"the checkpoint's CLEAR buffer holds {state['capacity']} unrolls, this run "
                                f"{self.capacity}")
        n = min(state["seen"], self.capacity)
        for k, v in self.data.items():
            saved = state["data"][k].numpy()
            if saved.shape[1:] != v.shape[1:] or len(saved) != n:
                raise TrainingError(f"the checkpoint's CLEAR buffer field {k} has shape {tuple(saved.shape)}, "
                                    f"expected ({n}, {', '.join(map(str, v.shape[1:]))})")
            v[:n] = saved
        self.seen = state["seen"]
        self.rng.bit_generator.state = state["rng"]


def unroll_items(batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The learner batch's slots [S, T(+1), n, ...] as S*n single-env unrolls [S*n, T(+1), ...], in the column order
    of impala's time-major tensors (slot-major, then env)."""
    def items(x: torch.Tensor) -> np.ndarray:
        S, L, n = x.shape[:3]
        return x.transpose(1, 2).reshape(S * n, L, *x.shape[3:]).numpy()

    n = batch["action"].shape[2]
    out = {k: items(batch[k]) for k in ("obs", "action", "logits", "reward", "done", "value")}
    out["regime"] = batch["regime"].repeat_interleave(n).numpy()
    return out


def cloning_losses(current_logits: torch.Tensor, stored_logits: torch.Tensor, current_values: torch.Tensor,
                   stored_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over the replayed [T, R] steps: KL(pi_stored || pi_current) and (V_current - V_stored)^2."""
    stored_logp = F.log_softmax(stored_logits, -1)
    kl = (stored_logp.exp() * (stored_logp - F.log_softmax(current_logits, -1))).sum()
    return kl, ((current_values - stored_values) ** 2).sum()


class Clear(Extension):
    """The learner extension agents/impala.py calls (see the module docstring for the order)."""

    state_key, state_optional = "clear", False  # the replay buffer (a resumed run loads it)

    def __init__(self, args: Args, session: RunSession, agent, optimizer, obs_space, n_actions: int,
                 device: torch.device):
        self.args, self.session, self.device = args, session, device
        self.T = args.unroll_length
        self.n_replay = clear_replay_count(args)
        capacity = args.clear_buffer_frames // self.T
        obs_dtype = np.uint8 if obs_space.dtype == np.uint8 else np.float32
        folder = os.path.join(session.run_dir, "replay")
        self.buffer = ReservoirReplay(folder, capacity, self.T, obs_space.shape, obs_dtype, n_actions,
                                      seed=args.seed + 2_000_003)
        self.pending: Optional[dict[str, np.ndarray]] = None
        self.replayed: Optional[dict[str, torch.Tensor]] = None
        self.scalars_: dict[str, float] = {}  # the last update's, logged with the iteration
        new = args.batch_size * (args.num_envs // args.num_actors)
        print(f"CLEAR: replay buffer of {capacity} unrolls x {self.T} steps, {self.buffer.nbytes() / 1e9:.3f} GB in "
              f"{folder} ({len(self.buffer)} filled); each update: {new} new + {self.n_replay} replayed unrolls",
              flush=True)

    def state_dict(self) -> dict:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)

    def extend_batch(self, agent, tm: dict, batch: dict) -> dict:
        """The learner's time-major [T(+1), B, ...] tensors with R replayed unrolls appended as columns; `batch`:
        the fleet's unrolls."""
        self.pending = unroll_items(batch)
        R = self.n_replay
        if R == 0:
            self.replayed = None
            return tm
        if len(self.buffer):
            replay = self.buffer.sample(R)
        else:  # nothing committed yet: repeat some of the new unrolls
            idx = np.sort(self.buffer.rng.integers(0, len(self.pending["regime"]), size=R))
            replay = {k: v[idx] for k, v in self.pending.items()}
        r = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in replay.items()}
        self.replayed = {"logits": r["logits"].transpose(0, 1), "value": r["value"].transpose(0, 1),
                         "regime": r["regime"]}
        return {k: torch.cat([x, r[k].transpose(0, 1).to(x.dtype)], 1) for k, x in tm.items()}

    def loss_terms(self, agent, batch: dict) -> dict:
        """The cloning losses, added to IMPALA's (V-trace on new and replayed columns); batch["logits"] [T, B+R, A]
        and batch["values"] [T+1, B+R] of the current network, the replayed columns last."""
        if self.replayed is None:
            self.scalars_ = {"charts/replay_size": float(len(self.buffer))}
            return {}
        R, T, logits, values = self.n_replay, self.T, batch["logits"], batch["values"]
        kl, v2 = cloning_losses(logits[:, -R:], self.replayed["logits"], values[:T, -R:], self.replayed["value"])
        current = self.session.regime_index(self.session.modification)
        old = (self.replayed["regime"] != current).float().mean().item()
        self.scalars_ = {
            "losses/policy_cloning": kl.item() / (T * R), "losses/value_cloning": v2.item() / (T * R),
            "charts/replay_fraction": R / logits.shape[1], "charts/replay_size": float(len(self.buffer)),
            "charts/replay_other_regimes": old,
        }
        return {"policy_cloning": self.args.clear_policy_cloning * kl,
                "value_cloning": self.args.clear_value_cloning * v2}

    def scalars(self) -> dict[str, float]:
        return self.scalars_

    def after_update(self, batch: dict) -> None:
        """The batch's new unrolls enter the replay buffer once the update is done."""
        if self.pending is not None:
            self.buffer.insert(self.pending)
            self.pending = None


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> str:
    return impala.train(args, curriculum, resume_state, make_extension=Clear)


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "CLEAR", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
