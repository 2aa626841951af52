"""Progress & Compress (agents/pnc.py): the distillation step lowers KL(active || KB) (float64 KL by hand), the compress
loss equals kl_scale * KL + the online-EWC penalty on the KB computed by hand in float64 (Fisher from per-sample
gradients of an independent forward pass), the phase split, the active-column reset, an exact learner-level resume at
many moments, and CartPole runs through the real IMPALA learner: the KB does not change in progress updates and the
active column does not change in compress updates (checkpoint after every update), --resume from a switch and from a
compress checkpoint continues the uninterrupted run's records, eval.py plays the KB, bad input is one line."""

from __future__ import annotations

import glob
import io
import json
import os
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import continual_training_example
import eval as eval_script
from agents import pnc
from conftest import exit_2, run_main, run_script, write_config
from continual.config.args import Args
from continual.curricula import make_run_factory
from continual.evaluation.table import read_eval_table
from continual.plasticity.ewc import EWC
from continual.training.checkpoint import load_checkpoint
from continual.training.extensions import SwitchEvent
from continual.training.session import StateRegistry
from continual.training.tracking import read_metrics

SPU = 64  # agent steps per update of ARGS: batch_size 2 x unroll 16 x 2 envs per actor
ARGS = dict(env_id="CartPole-v1", backend="Gymnasium", architecture="PNC", num_envs=2, num_actors=1,
            unroll_length=16, batch_size=2, reward_scaling="none", ewc_samples=16, pnc_ewc_lambda=7.0,
            ewc_gamma=0.5, seed=3)
CURRICULUM = {"num_total_steps": 1024, "modifications": ["", "gravity=15"], "switching_thresholds": [512]}


class FakeSession:
    """What PNC and EWC use of a RunSession, and its switch sequence (extensions around the switch)."""

    def __init__(self, args: Args, global_step: int = 0, switches: int = 0, modification: str = "",
                 resume: dict | None = None):
        self.args = args
        self.registry = StateRegistry(resume)  # the session's: PNC registers its state (resumed: loads it)
        self.register = self.registry.register
        self.factory = make_run_factory("SequentialModificationFactory", CURRICULUM, seed=args.seed, rollout_size=SPU)
        self.global_step, self.switches, self.modification = global_step, switches, modification
        self.callbacks: list = []

    def add_extension(self, ext):
        """As RunSession's: attached, called at switches, its state registered (resumed: loaded now)."""
        ext.attach(self)
        self.callbacks.append(ext)
        self.register(ext.state_key, ext.state_dict, ext.load_state_dict, optional=ext.state_optional)
        return ext

    def switch_start(self, new: str) -> SwitchEvent:
        event = SwitchEvent(self.modification, new, self.global_step, self.switches + 1)
        for cb in self.callbacks:
            cb.on_switch_start(event)
        return event

    def switch_end(self, event: SwitchEvent) -> None:
        self.switches, self.modification = event.count, event.new
        for cb in self.callbacks:
            cb.on_switch_end(event)


def build(args: Args, resume: dict | None = None):
    """Agent, RMSprop (IMPALA's), session and PNC extension, as impala.train builds them."""
    torch.manual_seed(args.seed)
    agent = pnc.PNCAgent((4,), 2)
    opt = torch.optim.RMSprop(agent.parameters(), lr=6e-4, alpha=0.99, eps=0.01, momentum=0.0)
    session = FakeSession(args, resume=resume)
    if resume is not None:
        agent.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        session.global_step, session.switches, session.modification = (resume["global_step"], resume["switches"],
                                                                        resume["modification"])
    ext = session.add_extension(pnc.PNC(session.args, session, agent, opt, None, None, torch.device("cpu")))
    return agent, opt, session, ext


def pnc_loss(ext, loss, obs, logits):
    """The loss P&C gives impala.train (from IMPALA's) and the scalars it logs with the update."""
    return ext.loss(loss, None, {"obs": obs, "logits": logits}), ext.scalars()


# --- float64 references ----------------------------------------------------------------------------------------------


def kb64(agent: pnc.PNCAgent) -> dict[str, torch.Tensor]:
    return {n: p.detach().double().clone() for n, p in agent.kb.named_parameters()}


def kb_logits64(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The CartPole KB column (Linear-tanh-Linear-tanh-Linear) written out in float64."""
    h = torch.tanh(x.double() @ p["network.1.weight"].T + p["network.1.bias"])
    h = torch.tanh(h @ p["network.3.weight"].T + p["network.3.bias"])
    return h @ p["actor.weight"].T + p["actor.bias"]


def kl64(active_logits: torch.Tensor, kb_logits: torch.Tensor) -> float:
    a = np.asarray(active_logits.detach(), np.float64).reshape(-1, active_logits.shape[-1])
    b = np.asarray(kb_logits.detach(), np.float64).reshape(-1, kb_logits.shape[-1])
    pa = np.exp(a - a.max(1, keepdims=True))
    pa /= pa.sum(1, keepdims=True)
    lb = b - b.max(1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    return float((pa * (np.log(pa) - lb)).sum())


def fisher64(agent: pnc.PNCAgent, obs: torch.Tensor, seed: int, count: int) -> dict[str, torch.Tensor]:
    """Mean of squared per-sample gradients of log pi_KB(a|s) in float64, one sample at a time, with the actions EWC
    draws (its generator seed, softmax of the float32 logits)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + count)
    with torch.no_grad():
        probs = torch.softmax(agent.kb_logits(obs).double(), -1)
    actions = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    base = kb64(agent)
    total = {n: torch.zeros_like(t) for n, t in base.items()}
    for x, a in zip(obs, actions):
        p = {n: t.clone().requires_grad_(True) for n, t in base.items()}
        logp = torch.log_softmax(kb_logits64(p, x.unsqueeze(0)), -1)[0, a]
        grads = torch.autograd.grad(logp, list(p.values()), allow_unused=True)  # the critic: F = 0
        for n, g in zip(p, grads):
            if g is not None:
                total[n] += g**2
    return {n: t / len(obs) for n, t in total.items()}


def batch(i: int, T: int = 4, B: int = 4) -> torch.Tensor:
    return torch.randn(T, B, 4, generator=torch.Generator().manual_seed(1000 + i))


# --- the compress step ----------------------------------------------------------------------------------------------


def test_kl_matches_a_float64_hand_computation():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, 6, generator=g) * 3, torch.randn(5, 3, 6, generator=g)
    assert pnc.kl_active_kb(a, b).item() == pytest.approx(kl64(a, b), rel=1e-5)
    assert pnc.kl_active_kb(a, a).item() == pytest.approx(0.0, abs=1e-5)


def test_distillation_steps_lower_kl_active_kb_on_a_fixed_batch():
    args = Args(**ARGS)
    agent, opt, session, ext = build(args)
    with torch.no_grad():
        agent.active.actor.weight.mul_(300.0)  # a peaked active policy, far from the near-uniform KB
    session.global_step = 320  # update 5 of 8 of the first task: compress
    assert ext.phase(session.global_step) == "compress"
    obs = batch(0)
    flat = obs.reshape(-1, 4)
    kls = []
    for _ in range(10):
        logits, _ = agent.logits_and_values(flat)
        kls.append(kl64(logits, kb_logits64(kb64(agent), flat)))
        loss, scalars = pnc_loss(ext, torch.zeros(()), obs, logits.view(4, 4, -1))
        assert scalars["pnc/compress"] == 1.0
        assert scalars["losses/pnc_kl"] == pytest.approx(kls[-1] / 16, rel=1e-4)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), 40.0)
        opt.step()
    logits, _ = agent.logits_and_values(flat)
    kls.append(kl64(logits, kb_logits64(kb64(agent), flat)))
    assert kls[0] > 1.0, kls  # the gap is real
    assert all(b < a for a, b in zip(kls, kls[1:])), kls
    assert kls[-1] < 0.5 * kls[0], kls


def test_compress_loss_is_kl_plus_online_ewc_penalty_by_hand():
    """Two consolidations (CORA's order: F <- gamma * F + F_new, then F <- F/|F| per tensor; theta* the latest KB),
    then the compress loss at moved KB weights equals kl_scale * KL + lambda/2 sum F (theta - theta*)^2, all by hand
    in float64."""
    args = Args(**{**ARGS, "pnc_kl_scale": 0.3})
    agent, opt, session, ext = build(args)
    g = torch.Generator().manual_seed(5)
    refs = []
    for count, new in ((1, "gravity=15"), (2, "")):
        with torch.no_grad():  # the KB moved during the task's compress phase
            for p in agent.kb.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        obs = batch(count)
        pnc_loss(ext, torch.zeros(()), obs, torch.zeros(4, 4, 2))  # fills EWC's buffer (16 = ewc_samples rows)
        refs.append((fisher64(agent, obs.reshape(-1, 4), args.seed, count), kb64(agent)))
        session.switch_end(session.switch_start(new))
    def unit(fr):
        return {n: f / f.norm() if f.norm() > 0 else f for n, f in fr.items()}  # critic: F = 0

    first = unit(refs[0][0])
    fisher = unit({n: args.ewc_gamma * first[n] + refs[1][0][n] for n in first})
    assert all(abs(float(f.norm()) - 1) < 1e-9 for n, f in fisher.items() if f.norm() > 0)
    theta_star = refs[1][1]
    for n, t in ext.ewc.anchors["online"][0].items():
        assert torch.equal(t.double(), theta_star[n]), n
    for n, f in ext.ewc.anchors["online"][1].items():
        assert torch.allclose(f.double(), fisher[n], rtol=1e-4, atol=1e-9), n

    with torch.no_grad():
        for p in agent.kb.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    theta = kb64(agent)
    penalty = 0.5 * args.pnc_ewc_lambda * sum(float((fisher[n] * (theta[n] - theta_star[n]) ** 2).sum())
                                              for n in theta)
    assert penalty > 0
    assert ext.ewc.penalty().item() == pytest.approx(penalty, rel=1e-4)
    session.global_step = 832  # second task, update 6 of 8: compress
    obs = batch(9)
    active = torch.randn(4, 4, 2, generator=g) * 2
    loss, scalars = pnc_loss(ext, torch.zeros(()), obs, active)
    kl = kl64(active, kb_logits64(theta, obs.reshape(-1, 4)))
    assert loss.item() == pytest.approx(0.3 * kl + penalty, rel=1e-4)
    assert scalars["losses/pnc_ewc_penalty"] == pytest.approx(penalty, rel=1e-4)


def test_phase_split_follows_the_fraction_of_each_visit():
    for fraction, progress in ((0.5, 4), (0.3, 3), (0.9, 8), (0.05, 1)):  # ceil(fraction x 8 updates per visit)
        _, _, _, ext = build(Args(**{**ARGS, "pnc_progress_fraction": fraction}))
        phases = [ext.phase(s) for s in range(0, 1024, SPU)]
        assert phases == (["progress"] * progress + ["compress"] * (8 - progress)) * 2, (fraction, phases)


def test_progress_loss_is_impala_loss_and_touches_no_kb_weight():
    agent, opt, session, ext = build(Args(**ARGS))
    obs = batch(1)
    logits, values = agent.logits_and_values(obs.reshape(-1, 4))
    impala_loss = -(F.log_softmax(logits, -1)[:, 0]).sum() + (values**2).sum()
    loss, scalars = pnc_loss(ext, impala_loss, obs, logits.view(4, 4, -1))
    assert loss is impala_loss and scalars["pnc/compress"] == 0.0
    loss.backward()
    assert all(p.grad is None for p in agent.kb.parameters())
    assert all(p.grad is not None for _, p in agent.active_parameters())


def test_switch_resets_the_active_column_seeded_and_keeps_the_kb():
    args = Args(**ARGS)
    agent, opt, session, ext = build(args)
    obs = batch(2).reshape(-1, 4)
    logits, values = agent.logits_and_values(obs)
    (logits.sum() + values.sum()).backward()
    opt.step()
    kb_before = {n: t.clone() for n, t in agent.kb.state_dict().items()}
    kb_params = list(agent.kb.parameters())
    with torch.no_grad():
        for p in agent.kb.parameters():
            p.add_(1.0)
    kb_before = {n: t.clone() for n, t in agent.kb.state_dict().items()}
    opt.state[kb_params[0]] = {"step": torch.tensor(1.0), "square_avg": torch.ones_like(kb_params[0])}
    session.global_step = 512
    session.switch_end(session.switch_start("gravity=15"))
    with torch.random.fork_rng():
        torch.manual_seed(args.seed * 1_000_003 + 1)
        fresh = pnc.PNCAgent((4,), 2)
    fresh_state = fresh.state_dict()
    for n, t in agent.state_dict().items():
        if n.startswith("kb."):
            assert torch.equal(t, kb_before[n[3:]]), n
        else:
            assert torch.equal(t, fresh_state[n]), n
    assert all(p not in opt.state for _, p in agent.active_parameters())
    assert kb_params[0] in opt.state  # the KB's optimizer state is kept


# --- exact resume of the learner (P&C's state: EWC buffer, anchor, Fisher; phases; resets) --------------------------


def learner_run(stop_at=None, resume=None):
    """16 updates of IMPALA-like learning with P&C through the switch at 512 on fixed batches; `stop_at` (update
    index, or "switch": after on_switch_start, where RunSession writes switch checkpoints) returns a checkpoint."""
    args = Args(**ARGS)
    agent, opt, session, ext = build(args, resume)
    records = []
    pending = resume is not None and resume.get("mid_switch")
    while session.global_step < 1024:
        i = session.global_step // SPU
        if session.global_step == 512 and (session.switches == 0 or pending):
            event = session.switch_start("gravity=15")
            if stop_at == "switch":
                return checkpoint(agent, opt, session, ext, mid_switch=True)
            session.switch_end(event)
            pending = False
        if stop_at == i:
            return checkpoint(agent, opt, session, ext)
        obs = batch(i)
        logits, values = agent.logits_and_values(obs.reshape(-1, 4))
        adv = torch.randn(16, generator=torch.Generator().manual_seed(i))
        impala_loss = -(F.log_softmax(logits, -1)[:, i % 2] * adv).sum() + 0.5 * ((values - adv) ** 2).sum()
        loss, scalars = pnc_loss(ext, impala_loss, obs, logits.view(4, 4, -1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), 40.0)
        opt.step()
        session.global_step += SPU
        records.append((session.global_step, scalars))
    return records, agent.state_dict(), session.registry.state_dicts()


def checkpoint(agent, opt, session, ext, mid_switch=False) -> dict:
    buf = io.BytesIO()
    torch.save({"model": agent.state_dict(), "optimizer": opt.state_dict(), "global_step": session.global_step,
                "switches": session.switches, "modification": session.modification, "mid_switch": mid_switch,
                **session.registry.state_dicts()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted():
    return learner_run()


@pytest.mark.parametrize("stop_at", [1, 3, 5, 7, "switch", 8, 10, 13])
def test_learner_resume_at_any_moment_equals_the_uninterrupted_run(uninterrupted, stop_at):
    records, state, ext_state = uninterrupted
    assert [r[1]["pnc/compress"] for r in records] == [0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4
    assert all(r[1]["losses/pnc_ewc_penalty"] == 0.0 for r in records[:8])
    assert all(r[1]["losses/pnc_ewc_penalty"] > 0.0 for r in records[13:])  # the KB moved away from its anchor
    ckpt = learner_run(stop_at=stop_at)
    records2, state2, ext_state2 = learner_run(resume=ckpt)
    n = len(records2)
    assert records2 == records[-n:]
    for k, t in state.items():
        assert torch.equal(t, state2[k]), k
    assert ext_state2["pnc"]["ewc"]["consolidated"] == ext_state["pnc"]["ewc"]["consolidated"] == 1
    for part in (1, 2):
        for k, t in ext_state["pnc"]["ewc"]["anchors"][0][part].items():
            assert torch.equal(t, ext_state2["pnc"]["ewc"]["anchors"][0][part][k]), k


# --- CartPole through the real IMPALA learner -------------------------------------------------------------------------

RUN_CONFIG = {k: v for k, v in ARGS.items() if k not in ("architecture", "ewc_samples")}
RUN_CONFIG.update(ewc_samples=64, modification_factory="SequentialModificationFactory",
                  modification_factory_kwargs=CURRICULUM, eval_at_switches=True, eval_episodes=2, eval_num_envs=2,
                  max_episode_steps=100)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pnc")
    cfg = write_config(tmp, RUN_CONFIG, "cfg.json")
    runs = tmp / "runs"
    proc = run_script("continual_training_example.py", "--architecture", "PNC", "--config", str(cfg), "--runs_dir",
                      str(runs), "--run_name", "full", "--save_agent_with_switch", "--checkpoint_every", str(SPU),
                      "--keep_checkpoints", "100", "--track", "--no-progress-bar")
    assert "1 actors x 2 envs, 64 steps per update" in proc.stdout
    return tmp, str(runs / "full")


def _ckpt(run_dir: str, name: str) -> dict:
    return torch.load(os.path.join(run_dir, "checkpoints", name), weights_only=True)


def _split(model: dict) -> tuple[dict, dict]:
    kb = {k: v for k, v in model.items() if k.startswith("kb.")}
    return kb, {k: v for k, v in model.items() if not k.startswith("kb.")}


def test_run_kb_frozen_in_progress_and_active_frozen_in_compress(full_run):
    _, run_dir = full_run
    records = [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "iteration"]
    assert [r["global_step"] for r in records] == list(range(SPU, 1025, SPU))
    phases = [r["pnc/compress"] for r in records]
    assert phases == [0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4
    models = {s: _ckpt(run_dir, f"periodic__step{s}.cleanrl_model")["model"] for s in range(SPU, 1025, SPU)}
    for r in records[1:]:  # the update that ended at step s started from the weights saved at s - SPU
        s = r["global_step"]
        before, after = _split(models[s - SPU]), _split(models[s])
        frozen = 1 if r["pnc/compress"] else 0  # (kb, active): the active column in compress, the KB in progress
        assert all(torch.equal(t, after[frozen][k]) for k, t in before[frozen].items()), s
        assert any(not torch.equal(t, after[1 - frozen][k]) for k, t in before[1 - frozen].items()), s
    final = _ckpt(run_dir, "final__step1024.cleanrl_model")
    assert final["architecture"] == "PNC" and final["pnc"]["ewc"]["consolidated"] == 1
    assert final["pnc"]["ewc"]["mode"] == "online" and [a[0] for a in final["pnc"]["ewc"]["anchors"]] == ["online"]
    # the anchor is the KB at the switch (after the first task's compress phase)
    kb_at_switch, _ = _split(_ckpt(run_dir, "switch__no_modif__step512.cleanrl_model")["model"])
    for k, t in final["pnc"]["ewc"]["anchors"][0][1].items():
        assert torch.equal(t, kb_at_switch["kb." + k]), k


def test_run_writes_wandb_offline_and_evaluates_every_regime(full_run):
    _, run_dir = full_run
    offline = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))
    assert offline and glob.glob(os.path.join(offline[0], "run-*.wandb")), os.listdir(run_dir)
    rows = read_eval_table(os.path.join(run_dir, "eval_table.csv"))
    assert sorted({(r["step"], r["modification"]) for r in rows}) == \
        [(s, m) for s in (0, 512, 1024) for m in ("", "gravity=15")]
    assert all(r["episodes"] == 2 for r in rows)


@pytest.mark.parametrize("start", ["switch__no_modif__step512", "periodic__step384", "periodic__step768"])
def test_resume_continues_the_uninterrupted_records(full_run, start):
    """The same iterations, regimes, phases and switch; the KB's anchor consolidated once. IMPALA's actors run
    asynchronously, so weights after the resume point differ from the uninterrupted run's (the learner-level test
    above checks exactness); an anchor written before the resume point is bit-identical."""
    tmp, run_dir = full_run
    copy = str(tmp / f"resumed_{start}")
    shutil.copytree(run_dir, copy)
    run_main("continual_training_example.py", "--resume", os.path.join(copy, "checkpoints", start + ".cleanrl_model"),
             "--no-progress-bar")

    def view(d):
        recs = read_metrics(os.path.join(d, "metrics.jsonl"))
        its = [(r["global_step"], r["modification"], r["pnc/compress"]) for r in recs if r["kind"] == "iteration"]
        sw = [(r["global_step"], r["modification"], r["switches"]) for r in recs if r["kind"] == "switch"]
        return its, sw

    assert view(copy) == view(run_dir)
    full, resumed = (_ckpt(d, "final__step1024.cleanrl_model")["pnc"]["ewc"] for d in (run_dir, copy))
    assert resumed["consolidated"] == 1  # a redone switch is not consolidated twice
    if start == "periodic__step384":  # the first task's compress phase is trained again after the resume
        return
    for part in (1, 2):  # theta* and F: bit-identical (both come from the first task, before the resume point)
        for k, t in full["anchors"][0][part].items():
            assert torch.equal(t, resumed["anchors"][0][part][k]), k


def test_eval_py_plays_the_knowledge_base(full_run):
    tmp, run_dir = full_run
    out = str(tmp / "eval_out")
    run_main("eval.py", "--agent_path", run_dir, "--modifs", "", "gravity=15", "--eval_episodes", "2",
             "--num_envs", "2", "--output", out)
    result = json.load(open(out + ".json"))
    assert result["architecture"] == "PNC" and result["global_step"] == 1024
    assert [r["episodes"] for r in result["results"]] == [2, 2]
    state = load_checkpoint(os.path.join(run_dir, "checkpoints", "final__step1024.cleanrl_model"))
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    agent = eval_script.load_policy(state, space, gym.spaces.Discrete(2), torch.device("cpu"))
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        kb = agent.kb.actor(agent.kb.features(x))
        assert torch.equal(agent.get_action_and_value(x, greedy=True)[0], kb.argmax(-1))
        assert not torch.equal(kb, agent.logits_and_values(x)[0])  # not the active column


# --- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, match", [
    ({"modification_factory_kwargs": {"num_total_steps": 1024, "modifications": ["gravity=15"],
                                      "switching_thresholds": []}}, "error: architecture: PNC needs task boundaries"),
    ({"pnc_progress_fraction": 1.0}, "error: pnc_progress_fraction: must be in (0, 1)"),
    ({"ewc": "online"}, "error: ewc: supported by"),
    ({"shrink_and_perturb": True}, "error: shrink_and_perturb: not with --architecture PNC"),
])
def test_bad_combinations_are_one_line_exit_2_and_no_run_dir(tmp_path, capsys, extra, match):
    cfg = write_config(tmp_path, {**RUN_CONFIG, **extra}, "cfg.json")
    scripts = [(continual_training_example.main, ["--architecture", "PNC"]), (pnc.main, [])]
    for main, argv in scripts if "modification_factory_kwargs" in extra else scripts[:1]:
        stdout, stderr = exit_2(main, [*argv, "--config", str(cfg), "--runs_dir", str(tmp_path / "runs"),
                                       "--no-progress-bar"], capsys)
        lines = stderr.strip().splitlines()
        assert len(lines) <= 3 and lines[0].startswith(match), stderr
        assert not stdout.strip() and not os.path.exists(tmp_path / "runs")


def test_ewc_on_the_kb_only():
    agent, _, _, ext = build(Args(**ARGS))
    assert isinstance(ext.ewc, EWC) and ext.ewc.model is agent.kb and ext.ewc.mode == "online"
    assert {id(p) for p in ext.ewc._params} == {id(p) for p in agent.kb.parameters()}
