"""The per-minibatch checks of the training loops copy nothing to the host more than they must.

On a GPU every `float(tensor)`, `.item()`, `.tolist()` or `bool(tensor)` waits for the device to finish the queued
work; PPO calls `check_losses` and `PlasticityMonitor.record_grads` once per minibatch (16 times per iteration with
CleanRL's defaults). da56a98:bench/gpu_micro.py measured on an H100 that the ten host syncs these two made per minibatch
cost ~35% of a minibatch update at 64 envs. The conversions are counted here on CPU by wrapping the Tensor methods
that produce host values; the results are checked against independent float64 references.
"""

from __future__ import annotations

import contextlib
import math
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from continual.errors import TrainingError
from continual.plasticity.diagnostics import PlasticityMonitor
from continual.training.guards import check_losses

HOST_METHODS = ("__float__", "__bool__", "__int__", "__index__", "item", "tolist", "numpy")


@contextlib.contextmanager
def count_host_copies():
    counter = {"n": 0}
    originals = {name: getattr(torch.Tensor, name) for name in HOST_METHODS}

    def wrap(fn):
        def counted(self, *a, **k):
            counter["n"] += 1
            return fn(self, *a, **k)
        return counted

    try:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, wrap(fn))
        yield counter
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def test_check_losses_finite_one_host_copy():
    losses = {"value_loss": torch.tensor(0.5), "policy_loss": torch.tensor(-0.1), "entropy": torch.tensor(1.1)}
    with count_host_copies() as c:
        check_losses(7, **losses)
    assert c["n"] <= 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("as_float", [False, True])
def test_check_losses_names_first_bad_loss(bad, position, as_float):
    # reference: the first loss, in the order given, whose float64 value is not finite
    values = [0.25, -3.0, 1.5]
    values[position] = bad
    if position < 2:  # a second bad loss later must not be the one named
        values[2] = float("nan")
    names = ["value_loss", "policy_loss", "entropy"]
    losses = {n: (v if as_float and i == 1 else torch.tensor(v)) for i, (n, v) in enumerate(zip(names, values))}
    first = next(n for n, v in zip(names, values) if not math.isfinite(v))
    with pytest.raises(TrainingError, match=rf"non-finite {first} \((nan|inf|-inf)\) at step 11"):
        check_losses(11, **losses)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("coef", [0.0, 0.01])
def test_check_losses_with_their_combination_names_the_same_bad_loss(bad, position, coef):
    """`combined` (PPO's loss, pg - ent_coef * entropy + vf_coef * v): a non-finite loss makes it non-finite, even at
    a coefficient of 0, so the same loss is named; finite losses whose combination overflows are let through, as
    without it."""
    values = [0.25, -3.0, 1.5]
    values[position] = bad
    losses = {n: torch.tensor(v) for n, v in zip(["value_loss", "policy_loss", "entropy"], values)}
    combined = losses["policy_loss"] - coef * losses["entropy"] + losses["value_loss"] * coef
    assert not math.isfinite(float(combined))
    name = ["value_loss", "policy_loss", "entropy"][position]
    with pytest.raises(TrainingError, match=rf"non-finite {name} \((nan|inf|-inf)\) at step 3"):
        check_losses(3, combined=combined, **losses)
    finite = {n: torch.tensor(3e38) for n in losses}
    check_losses(3, combined=finite["value_loss"] + finite["policy_loss"], **finite)  # inf: but each loss is finite
    with count_host_copies() as c:
        check_losses(3, combined=torch.tensor(0.5), value_loss=torch.tensor(0.5), policy_loss=torch.tensor(0.0))
    assert c["n"] <= 1


def test_check_losses_accepts_plain_floats():
    check_losses(1, a=0.0, b=1e30)
    with pytest.raises(TrainingError, match="non-finite b"):
        check_losses(1, a=0.0, b=float("inf"))


def _monitor(model: nn.Module) -> PlasticityMonitor:
    session = types.SimpleNamespace(args=types.SimpleNamespace(diagnostics_every=0), global_step=0, before_switch=[])
    return PlasticityMonitor(session, model)


def test_record_grads_no_host_copy_and_norms_match_float64_reference():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5), nn.Linear(5, 3))
    model(torch.randn(8, 2, 8, 8)).pow(2).sum().backward()
    monitor = _monitor(model)
    with count_host_copies() as c:
        monitor.record_grads()
    assert c["n"] == 0
    ref = {n: float(np.sqrt((m.weight.grad.double().numpy() ** 2).sum()))
           for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    got = monitor.grad_norms
    assert list(got) == list(ref)
    for n in ref:
        assert got[n] == pytest.approx(ref[n], rel=1e-6)


def test_record_grads_keeps_the_recorded_values_and_skips_layers_without_grad():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    monitor = _monitor(model)
    assert monitor.grad_norms == {}
    model[1](torch.randn(5, 4)).sum().backward()  # only the second layer gets a gradient
    monitor.record_grads()
    expected = float(np.sqrt((model[1].weight.grad.double().numpy() ** 2).sum()))
    model.zero_grad()  # the next minibatch's zero_grad must not change what was recorded
    assert list(monitor.grad_norms) == ["1"]
    assert monitor.grad_norms["1"] == pytest.approx(expected, rel=1e-6)
