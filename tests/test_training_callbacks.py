"""continual.training.callbacks with a real RunSession (fake logger and envs): the order of extension events around a
switch, an iteration, the end of the run; the built-in checkpoint extensions; shrink & perturb as an extension."""

from __future__ import annotations

import glob
import os
import signal

import numpy as np
import pytest
import torch
import torch.nn as nn

from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.curricula import make_factory
from continual.plasticity.shrink_perturb import SwitchRemedies, shrink_and_perturb
from continual.training.callbacks import CheckpointCallback, SwitchCheckpointCallback
from continual.training.extensions import Extension
from continual.training.session import RunSession

KWARGS = {"num_total_steps": 64, "modifications": ["", "b"], "switching_thresholds": [16]}


class FakeLogger:
    wandb_id = None
    wandb_run = None

    def __init__(self):
        self.records: list[tuple] = []

    def record(self, kind, step, **fields):
        self.records.append((kind, step))

    def scalars(self, values, step):
        pass

    def text(self, *a):
        pass

    def flush(self):  # before every checkpoint: what a resumed run keeps
        self.records.append(("flush", None))

    def close(self):
        pass


class FakeEnvs:
    def __init__(self, log):
        self.log = log

    def switch(self, new, step, seed=None):
        self.log.append(("envs.switch", new))
        return np.zeros(1), {}


class Recorder(Extension):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def on_switch_start(self, event):
        self.log.append((self.name, "switch_start", event.old, event.new, event.count))

    def on_switch_end(self, event):
        self.log.append((self.name, "switch_end", event.new))

    def on_iteration_end(self):
        self.log.append((self.name, "iteration_end", self.session.global_step))

    def on_checkpoint(self, path, name):
        self.log.append((self.name, "checkpoint", name, os.path.exists(path)))

    def on_training_end(self):
        self.log.append((self.name, "training_end"))

    def on_close(self):
        self.log.append((self.name, "close"))


@pytest.fixture
def make_session(tmp_path):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def make(**flags) -> RunSession:
        args = Args(exp_name="t", checkpoint_minutes=0, **flags)
        factory = make_factory("SequentialModificationFactory", KWARGS, seed=1)
        session = RunSession(args, Curriculum("SequentialModificationFactory", KWARGS), factory, 64, str(tmp_path),
                             FakeLogger(), ["", "b"], np.random.default_rng(0), None)
        session.register("model", lambda: {"w": torch.zeros(1)})
        session.register("optimizer", dict)
        return session

    yield make
    for s, h in handlers.items():
        signal.signal(s, h)


def _names(tmp_path) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "checkpoints" / "*.cleanrl_model")))


def test_event_order_of_a_run(make_session, tmp_path):
    session = make_session(save_agent_with_switch=True, checkpoint_every=16)
    log: list = []
    session.add_extension(Recorder("a", log))
    session.add_extension(Recorder("b", log))
    assert isinstance(session.extensions.extensions[-1], CheckpointCallback)  # the periodic checkpoints stay last
    assert isinstance(session.extensions.extensions[0], SwitchCheckpointCallback)
    envs = FakeEnvs(log)
    for step in (8, 16, 24):
        session.global_step = step
        session.maybe_switch(envs)
        session.end_iteration(step // 8, {})
    session.finish()
    session.close()
    assert log == [
        ("a", "iteration_end", 8), ("b", "iteration_end", 8),
        # the switch checkpoint holds the pre-switch state: written after every on_switch_start, before the switch
        ("a", "switch_start", "", "b", 1), ("b", "switch_start", "", "b", 1),
        ("a", "checkpoint", "switch__no_modif__step16", True), ("b", "checkpoint", "switch__no_modif__step16", True),
        ("envs.switch", "b"),
        ("a", "switch_end", "b"), ("b", "switch_end", "b"),
        # requested by the periodic callback, written once every callback has seen the iteration
        ("a", "iteration_end", 16), ("b", "iteration_end", 16),
        ("a", "checkpoint", "periodic__step16", True), ("b", "checkpoint", "periodic__step16", True),
        ("a", "iteration_end", 24), ("b", "iteration_end", 24),
        ("a", "training_end"), ("b", "training_end"),
        ("a", "checkpoint", "final__step24", True), ("b", "checkpoint", "final__step24", True),
        ("a", "close"), ("b", "close"),
    ]
    assert _names(tmp_path) == ["final__step24.cleanrl_model", "periodic__step16.cleanrl_model",
                                "switch__no_modif__step16.cleanrl_model"]


def test_no_switch_checkpoints_without_the_flag(make_session, tmp_path):
    session = make_session()
    assert not any(isinstance(cb, SwitchCheckpointCallback) for cb in session.extensions.extensions)
    session.global_step = 16
    session.maybe_switch(FakeEnvs([]))
    assert _names(tmp_path) == []


def test_time_based_checkpoint_counts_from_the_last_save(make_session, tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    session = make_session()
    session._periodic.minutes = 1.0
    session.last_save_time = clock[0]
    session.global_step = 8
    clock[0] += 59.0
    session.end_iteration(1, {})
    assert _names(tmp_path) == []
    clock[0] += 1.0
    session.global_step = 16
    session.end_iteration(2, {})
    assert _names(tmp_path) == ["periodic__step16.cleanrl_model"]
    clock[0] += 30.0
    session.global_step = 24
    session.end_iteration(3, {})  # 30 s since that checkpoint: not due
    assert _names(tmp_path) == ["periodic__step16.cleanrl_model"]


def test_switch_remedies_perturb_as_the_reference_with_the_switch_count(make_session):
    session = make_session(shrink_and_perturb=True, shrink_factor=0.5, noise_scale=0.1)
    torch.manual_seed(0)
    model, optimizer = nn.Linear(3, 2), None
    optimizer = torch.optim.Adam(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    session.add_extension(SwitchRemedies(model, optimizer, lambda: nn.Linear(3, 2)))
    session.global_step = 16
    session.maybe_switch(FakeEnvs([]))
    ref = nn.Linear(3, 2)
    ref.load_state_dict(before)
    shrink_and_perturb(ref, 0.5, 0.1, "noise", None, torch.Generator().manual_seed(session.args.seed * 1_000_003 + 1))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, ref.state_dict()[k])
    # by hand: theta' = 0.5 theta + 0.1 eps with the same generator draws
    gen = torch.Generator().manual_seed(session.args.seed * 1_000_003 + 1)
    w = before["weight"] * 0.5 + 0.1 * torch.randn(before["weight"].shape, generator=gen)
    torch.testing.assert_close(model.weight.detach(), w)


