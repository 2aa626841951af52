"""Shrink & perturb (continual/plasticity/shrink_perturb.py): both forms against hand-computed weights, the optimizer
reset, and, in training, weights changed only at switches."""

from __future__ import annotations

import glob
import os

import torch
import torch.nn as nn

from conftest import run_main, write_config
from continual.plasticity.shrink_perturb import reset_optimizer_state, shrink_and_perturb


def test_shrink_and_perturb_noise_form():
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    before = [p.detach().clone() for p in net.parameters()]
    shrink_and_perturb(net, 0.7, 0.01, "noise", generator=torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    for p, b in zip(net.parameters(), before):
        expected = 0.7 * b + 0.01 * torch.randn(b.shape, generator=gen)
        assert torch.allclose(p, expected, atol=1e-7)


def test_shrink_and_perturb_fresh_init_form_and_optimizer_reset():
    torch.manual_seed(0)
    net, fresh = nn.Linear(3, 2), nn.Linear(3, 2)
    before = [p.detach().clone() for p in net.parameters()]
    shrink_and_perturb(net, 0.5, 0.3, "fresh_init", fresh=fresh)
    for p, b, f in zip(net.parameters(), before, fresh.parameters()):
        assert torch.allclose(p, 0.5 * b + 0.3 * f.detach(), atol=1e-7)
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(2, 3)).sum().backward()
    opt.step()
    assert opt.state
    reset_optimizer_state(opt)
    assert not opt.state


def test_shrink_and_perturb_changes_weights_only_at_switches(tmp_path):
    """The first regime is never perturbed: with S&P and no switch the run equals a run without S&P."""
    base = {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 2,
            "reward_scaling": "none", "modification_factory": "SequentialModificationFactory",
            "modification_factory_kwargs": {"num_total_steps": 512, "modifications": [""], "switching_thresholds": []}}
    cfg = write_config(tmp_path, base, "c.json")
    runs = str(tmp_path / "runs")
    finals = {}
    for name, extra in (("plain", []), ("sp", ["--shrink_and_perturb"])):
        run_main("continual_training_example.py", "--config", str(cfg), "--runs_dir", runs, "--run_name", name,
                 "--no-progress-bar", *extra)
        finals[name] = torch.load(glob.glob(os.path.join(runs, name, "checkpoints", "final__*"))[0],
                                  weights_only=True)["model"]
    for k in finals["plain"]:
        assert torch.equal(finals["plain"][k], finals["sp"][k]), k
