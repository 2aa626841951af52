"""Continual PPO end to end: smoke runs (in-process; as subprocesses where the process matters: signals, W&B),
run directory, checkpoints, resume, eval.py, W&B offline."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, assert_resume_matches, run_main, write_config
from continual.training.tracking import read_metrics

CARTPOLE_CURRICULUM = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 2,
    "reward_scaling": "none",
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 2048, "modifications": ["", "gravity=15", "length=0.8", ""],
                                    "switching_thresholds": [512, 1024, 1536]},
}


def only_run_dir(runs: str) -> str:
    dirs = [d for d in glob.glob(os.path.join(runs, "*")) if os.path.isdir(d)]
    assert len(dirs) == 1, dirs
    return dirs[0]


def tb_tags(run_dir: str) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    return set(acc.Tags()["scalars"])


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cartpole")
    cfg = write_config(tmp, CARTPOLE_CURRICULUM)
    runs = str(tmp / "runs")
    proc = run_main("continual_training_example.py", "--config", cfg, "--runs_dir", runs, "--run_name", "cp",
                    "--save_agent_with_switch", "--checkpoint_every", "512", "--keep_checkpoints", "2",
                    "--no-progress-bar")
    return os.path.join(runs, "cp"), proc


def test_cartpole_curriculum_run_directory(cartpole_run):
    run_dir, proc = cartpole_run
    assert "PPO on CartPole-v1 (Gymnasium), seed 1" in proc.stdout and "resolved configuration" not in proc.stdout
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["modification_factory"] == "SequentialModificationFactory"
    assert config["num_envs"] == 2 and config["resolved_total_timesteps"] == 2048

    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    switches = [(r["global_step"], r["modification"]) for r in records if r["kind"] == "switch"]
    assert switches == [(512, "gravity=15"), (1024, "length=0.8"), (1536, "")]
    iterations = [r["global_step"] for r in records if r["kind"] == "iteration"]
    assert iterations == list(range(128, 2049, 128))
    episodes = [r for r in records if r["kind"] == "episode"]
    assert episodes and all(r["return"] == r["length"] for r in episodes)  # CartPole: +1 per step

    tags = tb_tags(run_dir)
    for tag in ("charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
                "charts/regime", "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl",
                "losses/clipfrac", "losses/explained_variance", "episodic_return_by_modif/no_modif",
                "episodic_return_by_modif/gravity=15"):
        assert tag in tags, tag


def test_checkpoints_at_switches_periodic_and_final(cartpole_run):
    run_dir, _ = cartpole_run
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "*")))
    # switch checkpoints are named after the outgoing regime and the step: a recurring regime keeps both files
    assert "switch__no_modif__step512.cleanrl_model" in names
    assert "switch__gravity=15__step1024.cleanrl_model" in names
    assert "switch__length=0.8__step1536.cleanrl_model" in names
    assert "final__step2048.cleanrl_model" in names
    periodic = [n for n in names if n.startswith("periodic__")]
    assert periodic == ["periodic__step1536.cleanrl_model", "periodic__step2048.cleanrl_model"]  # keep 2
    assert not [n for n in names if n.startswith(".tmp")]

    state = torch.load(os.path.join(run_dir, "checkpoints", "final__step2048.cleanrl_model"), weights_only=True)
    for key in ("model", "optimizer", "global_step", "factory_state", "rng", "reward_scaler", "args", "curriculum",
                "library_version", "format_version", "architecture", "modification", "switches"):
        assert key in state, key
    assert state["global_step"] == 2048 and state["architecture"] == "PPO" and state["switches"] == 3
    assert state["args"]["env_id"] == "CartPole-v1"
    assert state["factory_state"]["modification_factory"] == "SequentialModificationFactory"
    switch = torch.load(os.path.join(run_dir, "checkpoints", "switch__gravity=15__step1024.cleanrl_model"),
                        weights_only=True)
    assert switch["modification"] == "gravity=15" and switch["global_step"] == 1024


def test_eval_prints_a_row_per_modification(cartpole_run, tmp_path):
    run_dir, _ = cartpole_run
    out = str(tmp_path / "evalout")
    proc = run_main("eval.py", "--agent_path", run_dir, "--modifs", "", "gravity=15", "--eval_episodes", "3",
                    "--greedy", "--output", out)
    assert "(none)" in proc.stdout and "gravity=15" in proc.stdout
    result = json.load(open(out + ".json"))
    rows = {r["modification"]: r for r in result["results"]}
    assert set(rows) == {"", "gravity=15"} and all(r["episodes"] == 3 for r in rows.values())
    assert result["architecture"] == "PPO" and result["global_step"] == 2048
    assert open(out + ".csv").readline().startswith("modification,episodes,mean,std,min,max")


def test_eval_all_regimes_evaluates_every_regime_of_the_curriculum(cartpole_run, tmp_path):
    run_dir, _ = cartpole_run
    out = str(tmp_path / "all")
    run_main("eval.py", "--agent_path", run_dir, "--all_regimes", "--eval_episodes", "1", "--output", out)
    mods = {r["modification"] for r in json.load(open(out + ".json"))["results"]}
    assert mods == {"", "gravity=15", "length=0.8"}


def test_interrupted_run_resumes_with_the_same_schedule(tmp_path):
    """SIGTERM mid-run -> checkpoint; --resume ends at the same step, with the same switches and a gap-free,
    duplicate-free metrics file, as an uninterrupted run."""
    data = {**CARTPOLE_CURRICULUM, "modification_factory_kwargs": {
        **CARTPOLE_CURRICULUM["modification_factory_kwargs"], "num_total_steps": 6144,
        "switching_thresholds": [1536, 3072, 4608]}}
    cfg = write_config(tmp_path, data)
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", cfg, "--runs_dir", runs, "--run_name", "full",
             "--no-progress-bar")

    env = {**os.environ, "WANDB_MODE": "offline"}
    proc = subprocess.Popen([sys.executable, "continual_training_example.py", "--config", cfg, "--runs_dir", runs,
                             "--run_name", "cut", "--no-progress-bar"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(runs, "cut", "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(metrics) and sum(1 for ln in open(metrics) if '"iteration"' in ln) >= 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    interrupted = glob.glob(os.path.join(runs, "cut", "checkpoints", "interrupted__step*.cleanrl_model"))
    assert len(interrupted) == 1
    cut_step = torch.load(interrupted[0], weights_only=True)["global_step"]
    assert 0 < cut_step < 6144

    run_main("continual_training_example.py", "--resume", os.path.join(runs, "cut"), "--no-progress-bar")

    full = read_metrics(os.path.join(runs, "full", "metrics.jsonl"))
    cut = read_metrics(metrics)
    for kind in ("switch", "iteration"):
        assert [(r["global_step"], r["modification"]) for r in full if r["kind"] == kind] == \
               [(r["global_step"], r["modification"]) for r in cut if r["kind"] == kind], kind
    steps = [r["global_step"] for r in cut if r["kind"] == "iteration"]
    assert steps == list(range(128, 6145, 128))
    assert os.path.exists(os.path.join(runs, "cut", "checkpoints", "final__step6144.cleanrl_model"))
    final = torch.load(os.path.join(runs, "cut", "checkpoints", "final__step6144.cleanrl_model"), weights_only=True)
    assert final["switches"] == 3
    assert [r["kind"] for r in full].count("episode") > 0


def test_resume_refuses_to_change_the_run(cartpole_run):
    run_dir, _ = cartpole_run
    proc = run_main("continual_training_example.py", "--resume", run_dir, "--learning_rate", "0.1", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "learning_rate" in proc.stderr


def test_existing_run_directory_is_never_overwritten(cartpole_run):
    run_dir, _ = cartpole_run
    before = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    proc = run_main("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium",
                    "--runs_dir", os.path.dirname(run_dir), "--run_name", "cp", "--total_timesteps", "2048",
                    check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == before


def test_hackatari_freeway_two_regimes_with_video_and_eval(tmp_path):
    cfg = write_config(tmp_path, {
        "env_id": "ALE/Freeway-v5", "backend": "HackAtari", "num_envs": 2, "num_steps": 64, "num_minibatches": 2,
        "update_epochs": 1, "max_episode_steps": 100,
        "modification_factory": "Sequential",
        "modification_factory_kwargs": {"num_total_steps": 512, "modifications": ["", "all_green_cars"],
                                        "switching_thresholds": [256]},
    })
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", cfg, "--runs_dir", runs, "--run_name", "fw",
             "--capture_video", "--save_agent_with_switch", "--no-progress-bar")
    run_dir = os.path.join(runs, "fw")
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [(r["global_step"], r["modification"]) for r in records if r["kind"] == "switch"] == \
           [(256, "all_green_cars")]
    episodes = [r for r in records if r["kind"] == "episode"]
    assert {r["modification"] for r in episodes} == {"", "all_green_cars"}
    assert all(r["length"] == 100 for r in episodes)  # truncated at the cap, whole games
    videos = sorted(os.listdir(os.path.join(run_dir, "videos")))
    assert any(v.startswith("no_modif__step0-episode-0") for v in videos), videos
    assert any(v.startswith("all_green_cars__step256-episode-") for v in videos), videos
    assert os.path.exists(os.path.join(run_dir, "checkpoints", "switch__no_modif__step256.cleanrl_model"))

    out = str(tmp_path / "fw_eval")
    run_main("eval.py", "--agent_path", run_dir, "--modifs", "all_green_cars", "disable_cars",
             "--eval_episodes", "2", "--eval_max_episode_steps", "100", "--output", out)
    rows = json.load(open(out + ".json"))["results"]
    assert [r["modification"] for r in rows] == ["all_green_cars", "disable_cars"]
    assert all(r["episodes"] == 2 and r["mean_length"] == 100 and r["capped"] == 2 for r in rows)


# slow since 2026-12-02 (36-43 s): the games PPO plays are pinned exactly in the default suite
# (test_ppo_plays_the_games_of_the_pinned_reference), as the other agents' learning checks are slow
@pytest.mark.slow
def test_ppo_learns_cartpole(tmp_path):
    """Learning check: PPO on CartPole reaches a mean return >= 400 over 20 consecutive games within 64k steps (fixed
    seed; an untrained agent scores ~20). Seed 1 plays 500s from ~47k steps (490 for the last 20 games at 64k); the
    check ran 100k steps until 2026-11-29; a 100k run on 2 torch threads dipped to ~180 near 80k and recovered. The
    best window, not the last: seeds 1-4 all reach 500 over 20 games, but seed 2's last 20 average 317, so the last
    window would fail on a platform whose float rounding changes the trajectory."""
    cfg = json.load(open(os.path.join(ROOT, "configs", "cartpole_gravity.json")))
    cfg.pop("modification_factory")
    cfg.pop("modification_factory_kwargs")
    path = write_config(tmp_path, cfg)
    runs = str(tmp_path / "runs")
    run_main("agents/ppo.py", "--config", path, "--total_timesteps", "64000", "--seed", "1", "--runs_dir", runs,
             "--no-progress-bar")
    records = read_metrics(os.path.join(only_run_dir(runs), "metrics.jsonl"))
    returns = [r["return"] for r in records if r["kind"] == "episode"]
    windows = np.convolve(returns, np.ones(20) / 20, mode="valid")  # the mean of every 20 consecutive games
    assert windows.max() >= 400, returns[-40:]


@pytest.mark.parametrize("switch_step", [512, 1024])
def test_resume_from_a_switch_checkpoint_equals_the_uninterrupted_run(tmp_path, switch_step):
    """A switch checkpoint holds the pre-switch state; resuming from it redoes the switch and then plays the same
    games with the same weights as the uninterrupted run (CartPole's starts are random: the env resets at a switch are
    seeded from the run's seed and the step, and the torch RNG is restored after the networks are built)."""
    from agents import ppo

    resume_from_switch(tmp_path, switch_step, ppo.main)


def resume_from_switch(tmp_path, switch_step: int, main, *extra: str) -> str:
    """Run the CartPole curriculum, cut it at the switch checkpoint of `switch_step`, resume, compare; returns the
    uninterrupted run's directory."""
    import shutil

    cfg = write_config(tmp_path, CARTPOLE_CURRICULUM)
    runs = str(tmp_path / "runs")
    common = ["--runs_dir", runs, "--no-progress-bar", "--no-cuda", "--checkpoint_minutes", "0", "--no-metrics"]
    main(["--config", cfg, "--run_name", "full", "--save_agent_with_switch", *common, *extra])
    full = os.path.join(runs, "full")
    switch = glob.glob(os.path.join(full, "checkpoints", f"switch__*step{switch_step}.cleanrl_model"))
    assert len(switch) == 1, os.listdir(os.path.join(full, "checkpoints"))
    cut = os.path.join(runs, "cut")
    shutil.copytree(full, cut)
    for f in glob.glob(os.path.join(cut, "checkpoints", "*")):
        if f"step{switch_step}." not in f:
            os.unlink(f)
    with open(os.path.join(cut, "metrics.jsonl")) as f:  # as if the run had been killed right after the switch save
        kept = [ln for ln in f if json.loads(ln)["global_step"] <= switch_step]
    with open(os.path.join(cut, "metrics.jsonl"), "w") as f:
        f.writelines(kept)
    main(["--resume", switch[0].replace(full, cut), "--no-progress-bar"])
    assert_resume_matches(full, cut, "final__step2048.cleanrl_model", switch_step)
    return full


PLASTICITY_FLAGS = {
    # at switches: ReDo (tau 0.5 so that units are recycled on CartPole's tanh network), a reset of the heads
    "switches": ["--redo", "--redo_tau", "0.5", "--reset_layers", "1", "--l2_init", "--parseval", "--layer_norm"],
    # every N steps, with the doubling activation
    "interval": ["--reset_layers", "2", "--reset_every", "384", "--l2", "--activation", "crelu", "--nap"],
    "interval_redo": ["--redo", "--redo_every", "256", "--redo_tau", "0.5"],
    "trac": ["--trac", "--activation", "fourier"],
    "trac_keep_base": ["--trac", "--trac_keep_base"],
    # plasticity injection at every switch, with the methods it combines with
    "injection": ["--plasticity_injection", "at_switches", "--redo", "--redo_tau", "0.5", "--l2_init",
                  "--shrink_and_perturb"],
    "injection_every": ["--plasticity_injection", "every", "--injection_every", "384", "--l2", "--layer_norm"],
    # PPO_CBP replacing units of the last hidden layer, which feeds the injected heads
    "injection_cbp": ["--plasticity_injection", "at_switches", "--replacement_rate", "1e-2", "--maturity_threshold",
                      "20"],
    # C-CHAIN: its reference network, coefficient and records (restarted at switches)
    "c_chain": ["--c_chain", "--c_chain_coef", "3"],
}


@pytest.mark.parametrize("arch,methods", [("PPO", "switches"), ("PPO", "interval"), ("PPO_CBP", "interval_redo"),
                                          ("PPO", "trac"), ("PPO", "trac_keep_base"), ("PPO", "injection"), ("PPO", "injection_every"),
                                          ("PPO_CBP", "injection_cbp"), ("PPO", "c_chain"), ("PPO_CBP", "c_chain")])
def test_plasticity_methods_resume_exactly_from_a_switch_checkpoint(tmp_path, arch, methods):
    """Every plasticity method's state is in the checkpoint: a resume from a switch checkpoint ends with the
    uninterrupted run's weights and games; the methods acted (units recycled, layers reset)."""
    import torch

    from agents import ppo, ppo_cbp
    from continual.training.tracking import read_metrics

    full = resume_from_switch(tmp_path, 1024, ppo.main if arch == "PPO" else ppo_cbp.main,
                              *PLASTICITY_FLAGS[methods], "--diagnostics_every", "512")
    records = read_metrics(os.path.join(full, "metrics.jsonl"))
    its = [r for r in records if r["kind"] == "iteration"]
    final = torch.load(os.path.join(full, "checkpoints", "final__step2048.cleanrl_model"), weights_only=True)
    state = final["plasticity_methods"]
    if "--redo" in PLASTICITY_FLAGS[methods]:
        recycled = [r["plasticity/redo_recycled"] for r in its if "plasticity/redo_recycled" in r]
        assert len(recycled) == (8 if "--redo_every" in PLASTICITY_FLAGS[methods] else 3) and sum(recycled) > 0, recycled
        assert state["redo_count"] == len(recycled)
    if "--reset_layers" in PLASTICITY_FLAGS[methods]:
        assert state["reset_count"] == (3 if methods == "switches" else 5)
    if "--plasticity_injection" in PLASTICITY_FLAGS[methods]:  # one injection per switch / per 384 steps, nested
        n = 5 if methods == "injection_every" else 3
        assert state["inject_count"] == n and "actor." + "old." * (n - 1) + "new.weight" in final["model"]
        # eval.py and continual evaluation rebuild the injected heads from the saved weights
        import gymnasium as gym

        from continual.evaluation.checkpoints import load_policy
        from eval import agent_module
        env = gym.make("CartPole-v1")
        agent = load_policy(final, env.observation_space, env.action_space, torch.device("cpu"), agent_module)
        assert isinstance(agent.actor, type(agent.critic)) and type(agent.actor).__name__ == "InjectedHead"
        if arch == "PPO_CBP":  # CBP replaced units of the last hidden layer, whose outgoing layers are injected heads
            assert int(final["model"]["cbp.trackers.1.replaced"]) > 0
    if "--trac" in PLASTICITY_FLAGS[methods]:  # the weights are the base iterate's displacement times a scale
        s = float(np.sum(final["optimizer"]["trac"]["s"]))
        assert 0 < s < 1e6 and its[-1]["plasticity/trac_scale"] == pytest.approx(s)  # logged every iteration
        assert all("plasticity/trac_scale" in r for r in its)
        assert bool(final["optimizer"]["trac"]["theta_base"]) == (methods == "trac_keep_base")  # kept, or recovered
    if "--c_chain" in PLASTICITY_FLAGS[methods]:
        assert final["c_chain"]["updates"] > 10 and [r["plasticity/c_chain_coef"] for r in its][-1] == 3.0
    plast = [r for r in records if r["kind"] == "plasticity"]
    keys = ["plasticity/stable_rank", "plasticity/weight_change/init", "plasticity/weight_change/switch"]
    if "fourier" not in PLASTICITY_FLAGS[methods]:  # sin/cos units have no active/inactive split
        keys.append("plasticity/active_fraction/all")
    assert plast and all(k in plast[-1] for k in keys), plast[-1]


@pytest.mark.parametrize("obs_shape", [(4, 84, 84), (6, 10, 10)])
def test_bf16_update_gradient_is_the_float32_gradient_to_bfloat16_precision(obs_shape):
    """--bf16: under autocast the heads and losses stay float32, the parameters get float32 gradients, and the
    minibatch gradient points where the float32 one does (cosine > 0.99, relative error < 5%: bfloat16 keeps 8 bits
    of mantissa)."""
    from agents.ppo import Agent

    torch.manual_seed(0)
    agent = Agent(obs_shape, 6, obs_scale=1 / 255)
    x = torch.randint(0, 256, (64,) + obs_shape, dtype=torch.uint8)
    actions = torch.randint(0, 6, (64,))
    grads = []
    for bf16 in (False, True):
        agent.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, logp, ent, value = agent.get_action_and_value(x, actions)
        assert logp.dtype == ent.dtype == value.dtype == torch.float32
        (-(logp * torch.linspace(-1, 1, 64)).mean() - 0.01 * ent.mean() + (value.view(-1) - 1).pow(2).mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in agent.parameters()]).double())
        assert all(p.grad.dtype == torch.float32 for p in agent.parameters())
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cos > 0.99 and (grads[1] - grads[0]).norm() / grads[0].norm() < 0.05, (cos, grads)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_pixel_input_conversion_gives_the_reference_loss_and_gradient_bit_for_bit(bf16):
    """Agent.scaled_input puts uint8 frames straight into float32 channels-last: the Nature CNN's loss and every
    gradient equal, bit for bit, those of the textbook `network(x.float() / 255)` on the NCHW batch (CleanRL's
    ppo_atari), in float32 and under --bf16's autocast; the caller's tensor is never changed in place."""
    from agents.ppo import Agent

    torch.manual_seed(0)
    agent = Agent((4, 84, 84), 3, obs_scale=1.0 / 255.0)
    x = torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8)
    weights = torch.linspace(-1, 1, 32)

    def loss_and_grads(features):
        agent.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = features(x)
            loss = (agent.actor(hidden).float().logsumexp(-1) * weights).mean() + agent.critic(hidden).float().pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in agent.parameters()]

    ref_loss, ref_grads = loss_and_grads(lambda obs: agent.network(obs.float() * (1.0 / 255.0)))
    loss, grads = loss_and_grads(agent.features)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    # a float32 channels-last batch must be copied, not scaled in place
    y = (x.float() / 7).contiguous(memory_format=torch.channels_last)
    before = y.clone()
    agent.scaled_input(y)
    assert torch.equal(y, before)


@pytest.mark.parametrize("case", ["cartpole", "minatar"])
def test_ppo_plays_the_games_of_the_pinned_reference(tmp_path, case):
    """The games played (step, env, return, length) and the final weights equal those recorded from an earlier
    revision (tests/helpers/ppo_reference.py): PPO's speed work changes how fast it learns, never what."""
    from helpers.ppo_reference import DATA, run_case

    with open(os.path.join(DATA, f"ppo_reference_{case}.json")) as f:
        expected = json.load(f)
    got = run_case(case, str(tmp_path))
    assert got["episodes"] == expected["episodes"]
    assert got["weights"].keys() == expected["weights"].keys()
    for name, w in expected["weights"].items():
        np.testing.assert_allclose([got["weights"][name]["sum"], got["weights"][name]["abs_sum"]],
                                   [w["sum"], w["abs_sum"]], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got["weights"][name]["first"], w["first"], rtol=1e-5, atol=1e-6, err_msg=name)


def test_acting_on_one_thread_learns_what_acting_on_the_updates_threads_learns(tmp_path):
    """--act_threads 1 (the default: the rollout's forward passes on one torch thread) and --act_threads 0 (on the
    update's 2, as before it existed) train pixel HackAtari Freeway to the same weights bit for bit: the act step's
    actions, log-probs and values do not depend on the thread count, and the update runs on its own 2 threads in
    both."""
    from helpers.ppo_reference import read_run

    config = write_config(tmp_path, {
        "env_id": "ALE/Freeway-v5", "backend": "HackAtari", "num_envs": 2, "num_steps": 32, "update_epochs": 1,
        "num_minibatches": 2, "seed": 2, "checkpoint_every": 0, "total_timesteps": 128, "torch_threads": 2,
        "vector_env": "sync"})
    runs = str(tmp_path / "runs")
    for name, extra in (("one", ()), ("update", ("--act_threads", "0"))):
        run_main("continual_training_example.py", "--config", config, "--runs_dir", runs, "--run_name", name,
                 "--no-progress-bar", *extra)
    assert read_run(os.path.join(runs, "one"))["weights"] == read_run(os.path.join(runs, "update"))["weights"]


def test_categorical_is_torch_categorical_bit_for_bit():
    """agents.ppo.categorical: the same samples (same random stream), log-probs, entropies and gradients as
    torch.distributions.Categorical(logits=...), including -inf logits (masked actions)."""
    from torch.distributions.categorical import Categorical

    from agents.ppo import categorical

    logits = torch.randn(64, 6, dtype=torch.float32) * 3
    logits[0, 2] = float("-inf")
    for given in (False, True):
        a = logits.clone().requires_grad_(True)
        b = logits.clone().requires_grad_(True)
        torch.manual_seed(7)
        dist = Categorical(logits=a)
        ref_action = torch.randint(0, 6, (64,)) if given else dist.sample()
        ref = (ref_action, dist.log_prob(ref_action), dist.entropy())
        torch.manual_seed(7)
        got = categorical(b, ref_action if given else None)
        for x, y in zip(got, ref):
            assert torch.equal(x, y)
        if not given:  # acting without the entropy: the same draw and log-prob
            torch.manual_seed(7)
            action, logprob, entropy = categorical(logits, with_entropy=False)
            assert entropy is None and torch.equal(action, ref[0]) and torch.equal(logprob, ref[1].detach())
        (ref[1][1:].sum() + 0.01 * ref[2].sum()).backward()
        (got[1][1:].sum() + 0.01 * got[2].sum()).backward()
        assert torch.equal(a.grad, b.grad)
    assert torch.equal(categorical(logits, greedy=True)[0], logits.argmax(-1))


@pytest.mark.parametrize("replacement", [False, True])
def test_draw_is_torch_multinomial_bit_for_bit(replacement):
    """agents.networks.draw (IMPALA's actors, categorical's sample): torch.multinomial(probs, 1)'s draws from the same
    generator, over many draws, batch sizes and peaked, flat and zero-probability rows."""
    from agents.networks import draw

    gen = torch.Generator().manual_seed(3)
    for n in (1, 4, 64):
        logits = torch.randn(n, 6, generator=gen) * torch.tensor([0.1, 1.0, 10.0])[torch.arange(n) % 3, None]
        logits[0, 1] = float("-inf")
        probs = torch.softmax(logits, -1)
        torch.manual_seed(n)
        ref = [torch.multinomial(probs, 1, replacement).squeeze(-1) for _ in range(200)]
        torch.manual_seed(n)
        got = [draw(probs) for _ in range(200)]
        assert all(torch.equal(x, y) for x, y in zip(got, ref))
        assert not any((g[0] == 1).item() for g in got)  # a zero probability is never drawn


def test_mlp_network_is_purejaxrls_separate_actor_and_critic():
    """--network mlp: two 64-unit relu MLPs on the flattened grid, one for the policy and one for the value (the value
    loss reaches no actor weight), PureJaxRL's ActorCritic; the default network is unchanged."""
    from agents.ppo import Agent

    agent = Agent((4, 10, 10), 3, network="mlp", hidden_size=64, mlp_activation="relu")
    per_torso = 400 * 64 + 64 + 64 * 64 + 64
    assert sum(p.numel() for p in agent.network.parameters()) == per_torso
    assert sum(p.numel() for p in agent.critic_network.parameters()) == per_torso
    assert sum(p.numel() for p in agent.parameters()) == 2 * per_torso + 64 * 3 + 3 + 64 + 1
    x = torch.rand(5, 4, 10, 10)
    agent.get_value(x).sum().backward()
    assert all(p.grad is None for p in [*agent.network.parameters(), *agent.actor.parameters()])
    assert all(p.grad is not None for p in agent.critic_network.parameters())
    _, logprob, _, value = agent.get_action_and_value(x)
    assert torch.allclose(value, agent.get_value(x))
    assert sum(isinstance(m, torch.nn.ReLU) for m in agent.network) == 2


@pytest.mark.parametrize("arch", ["PPO", "IMPALA"])
def test_mlp_network_trains_and_evaluates_on_minatar(tmp_path, arch):
    runs = str(tmp_path / "runs")
    common = ["continual_training_example.py", "--architecture", arch, "--backend", "MinAtar", "--env_id",
              "MinAtar/Breakout-v1", "--network", "mlp", "--num_envs", "8", "--num_steps", "32",
              "--total_timesteps", "1024", "--runs_dir", runs, "--run_name", "m", "--no-progress-bar",
              "--checkpoint_every", "512"]
    if arch == "IMPALA":
        common += ["--num_actors", "2", "--unroll_length", "32", "--batch_size", "4"]
    run_main(*common)
    run_dir = os.path.join(runs, "m")
    state = torch.load(glob.glob(os.path.join(run_dir, "checkpoints", "final*"))[0], weights_only=False)
    assert any(k.startswith("critic_network.") for k in state["model"])
    proc = run_main("eval.py", "--agent_path", run_dir, "--eval_episodes", "2", "--output", str(tmp_path / "e"))
    assert json.load(open(str(tmp_path / "e") + ".json"))["results"][0]["episodes"] == 2
    assert proc.returncode == 0


def test_the_rollout_is_cleanrls_loop_without_a_her_branch():
    """HER and CBP reach PPO through the extension hooks: train() has one `for step in range(args.num_steps)`
    rollout, and no `if` in it (or anywhere in train) tests HER."""
    import ast
    import inspect
    import textwrap

    from agents import ppo

    tree = ast.parse(textwrap.dedent(inspect.getsource(ppo.train)))
    rollouts = [n for n in ast.walk(tree) if isinstance(n, ast.For) and ast.unparse(n.target) == "step"]
    assert [ast.unparse(n.iter) for n in rollouts] == ["range(args.num_steps)"]

    def mentions_her(node: ast.AST) -> bool:
        return any((isinstance(n, ast.Name) and "her" in n.id.split("_")) or
                   (isinstance(n, ast.Attribute) and n.attr.startswith("her")) for n in ast.walk(node))

    assert not any(mentions_her(n) for n in ast.walk(rollouts[0]))
    assert not any(isinstance(n, ast.If) and mentions_her(n.test) for n in ast.walk(tree))


@pytest.mark.parametrize("arch", ["PPO", "PPO_CBP"])
def test_adam_betas_reach_the_optimizer_and_its_checkpoint(tmp_path, arch):
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--architecture", arch, "--env_id", "CartPole-v1", "--backend",
             "Gymnasium", "--num_envs", "2", "--num_steps", "64", "--total_timesteps", "256", "--runs_dir", runs,
             "--run_name", "b", "--no-progress-bar", "--adam_beta1", "0.99", "--adam_beta2", "0.99")
    state = torch.load(glob.glob(os.path.join(runs, "b", "checkpoints", "final*"))[0], weights_only=True)
    groups = state["optimizer"]["param_groups"]
    assert [tuple(g["betas"]) for g in groups] == [(0.99, 0.99)] * len(groups)


def test_fused_adam_is_ppos_adam_up_to_float_rounding(tmp_path):
    """--fused_adam (configs/minatar_ppo.json sets it): 64 of PPO's minibatch updates of PureJaxRL's MinAtar MLPs
    with torch's fused Adam stay within float rounding of the default (foreach) Adam's, and a run with the flag
    trains with it (its checkpoint's optimizer is the fused one)."""
    from agents.ppo import Agent, ppo_loss
    from continual.config.args import Args

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    batches = [((torch.rand(256, 4, 10, 10, generator=gen) < 0.1).float(), torch.randint(0, 6, (256,), generator=gen),
                *(torch.randn(4, 256, generator=gen) * torch.tensor([[0.1], [1], [1], [1]]) - torch.tensor(
                    [[1.8], [0], [0], [0]]))) for _ in range(64)]
    args = Args(clip_coef=0.2, learning_rate=5e-3)

    def train(fused: bool):
        torch.manual_seed(0)
        agent = Agent((4, 10, 10), 6, network="mlp")
        opt = agent.make_optimizer(args.learning_rate, fused=fused)
        losses = []
        for obs, actions, logprobs, advantages, returns, values in batches:
            loss = ppo_loss(agent, args, obs, {}, torch.mean, actions, logprobs, advantages, returns, values)[0]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5, foreach=True)
            opt.step()
            losses.append(float(loss.detach()))
        return np.array(losses), [p.detach().clone() for p in agent.parameters()]

    (l0, w0), (l1, w1) = train(False), train(True)
    assert not np.array_equal(l0, l1)  # not the same kernel: the rounding differs
    np.testing.assert_allclose(l1, l0, rtol=1e-4, atol=1e-6)
    for a, b in zip(w0, w1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2",
             "--num_steps", "64", "--total_timesteps", "256", "--runs_dir", runs, "--run_name", "f",
             "--no-progress-bar", "--fused_adam")
    state = torch.load(glob.glob(os.path.join(runs, "f", "checkpoints", "final*"))[0], weights_only=True)
    assert state["optimizer"]["param_groups"][0]["fused"] is True


@pytest.mark.parametrize("norm_adv,clip_vloss", [(True, True), (False, True), (True, False)])
def test_ppo_loss_is_the_clipped_surrogate_computed_in_float64(norm_adv, clip_vloss):
    """agents.ppo.ppo_loss against the PPO paper's clipped surrogate (Schulman et al. 2017, eq. 7) and CleanRL's value
    clipping, KL estimates and clip fraction, written out here in float64 numpy from the network's logits and values,
    on a minibatch built so that both clips and the value clip bind on some samples (a ratio above 1 + eps with a
    positive advantage, below 1 - eps with a negative one): every returned quantity to float32 precision."""
    from agents.ppo import Agent, ppo_loss
    from continual.config.args import Args

    clip, ent_coef, vf_coef = 0.2, 0.01, 0.5
    args = Args(clip_coef=clip, ent_coef=ent_coef, vf_coef=vf_coef, norm_adv=norm_adv, clip_vloss=clip_vloss)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    agent = Agent((4, 10, 10), 6, network="mlp")
    n = 256
    obs = (torch.rand(n, 4, 10, 10, generator=gen) < 0.1).float()
    actions = torch.randint(0, 6, (n,), generator=gen)
    with torch.no_grad():
        hidden, critic_hidden = agent.torsos(obs)
        logits = agent.actor(hidden).double().numpy()
        value = agent.critic(critic_hidden).double().numpy().reshape(-1)
    logp_all = logits - logits.max(1, keepdims=True)
    logp_all = logp_all - np.log(np.exp(logp_all).sum(1, keepdims=True))
    logp = logp_all[np.arange(n), actions.numpy()]
    shift = torch.rand(n, generator=gen).double().numpy() * 1.2 - 0.7  # log-ratios in [-0.7, 0.5]
    mb_logprobs = torch.tensor(logp - shift, dtype=torch.float32)
    advantages = torch.randn(n, generator=gen) * 2.0 + 0.3
    returns = torch.randn(n, generator=gen)
    values = torch.tensor(value + (torch.rand(n, generator=gen).double().numpy() - 0.5) * 1.2, dtype=torch.float32)

    out = ppo_loss(agent, args, obs, {}, torch.mean, actions, mb_logprobs, advantages, returns, values)
    got = [float(x.detach()) for x in out]

    # the reference, float64
    logratio = logp - mb_logprobs.double().numpy()
    ratio = np.exp(logratio)
    adv = advantages.double().numpy()
    assert ((ratio > 1 + clip) & (adv > 0)).sum() > 10 and ((ratio < 1 - clip) & (adv < 0)).sum() > 10
    if norm_adv:
        adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv)
    pg_loss = -surrogate.mean()
    ret, old_v = returns.double().numpy(), values.double().numpy()
    if clip_vloss:
        assert (np.abs(value - old_v) > clip).sum() > 10
        v_loss = 0.5 * np.maximum((value - ret) ** 2, (old_v + np.clip(value - old_v, -clip, clip) - ret) ** 2).mean()
    else:
        v_loss = 0.5 * ((value - ret) ** 2).mean()
    entropy = -(np.exp(logp_all) * logp_all).sum(1).mean()
    want = [pg_loss - ent_coef * entropy + vf_coef * v_loss, pg_loss, v_loss, entropy, (-logratio).mean(),
            (ratio - 1 - logratio).mean(), (np.abs(ratio - 1) > clip).mean()]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


def test_gae_is_cleanrls_loop_bit_for_bit():
    """agents.ppo.gae computes every step's delta and discount at once: the same bits as CleanRL's loop (written out
    here), -0.0 included, with terminations and a done last step."""
    from agents.ppo import gae

    def cleanrl(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(rewards.shape[0])):
            if t == rewards.shape[0] - 1:
                nextnonterminal, nextvalues = 1.0 - next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        return advantages, advantages + values

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        rewards = torch.randn(128, 64, generator=g) * (torch.rand(128, 64, generator=g) < 0.3)
        values = torch.randn(128, 64, generator=g) * 3
        values[torch.rand(128, 64, generator=g) < 0.1] = -0.0
        dones = (torch.rand(128, 64, generator=g) < 0.05).float()
        next_value, next_done = torch.randn(1, 64, generator=g), (torch.rand(64, generator=g) < 0.5).float()
        for lam in (0.95, 1.0):
            got, want = gae(rewards, values, dones, next_value, next_done, 0.99, lam), cleanrl(
                rewards, values, dones, next_value, next_done, 0.99, lam)
            for a, b in zip(got, want):
                assert torch.equal(a.view(torch.int32), b.view(torch.int32))
