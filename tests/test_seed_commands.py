"""Every command of the seed project's README (hannah-sophie/continual_hackatari) runs here as written, with tiny
budgets added (a few hundred steps, 2 envs, games capped at a few dozen steps in training and evaluation, runs under a
temporary folder).

The seed's commands, in its README's order: train (`--config run_config.json --env_id ALE/Freeway-v5 --backend
HackAtari --architecture PPO --track --capture_video`), its EpsCombined run_config.json example, a custom factory
registered in `modification_factory_mapping`, HER (`--her`, `--game_specific_goals`), PPO_CBP with its four flags,
shrink & perturb with its two flags, checkpoints at switches and to W&B, the W&B flags, then eval.py
(`--agent_path runs/.../model.cleanrl_model --env_id ALE/Freeway-v5 --backend HackAtari --eval_episodes 50
--capture_video`, `--modifs "all_green_cars reverse_car_speed_top"`, `--her`, `--game_specific_goals`, the W&B
flags and `--wandb_run_id`).
"""

from __future__ import annotations

import glob
import json
import os
import sys

import pytest

from conftest import ROOT, run_script, write_config

pytest.importorskip("hackatari")

TINY = ["--num_envs", "2", "--num_steps", "32", "--num_minibatches", "2", "--update_epochs", "1",
        "--max_episode_steps", "30", "--eval_every", "0", "--no-plots", "--no-progress-bar"]
# eval.py plays whole games (~2,050 steps of Freeway) unless asked for a cap
EVAL_TINY = ["--eval_max_episode_steps", "30"]

# the seed README's run_config.json example, its steps scaled down
SEED_EXAMPLE_CONFIG = {
    "modification_factory": "EpsCombinedModificationFactory",
    "modification_factory_kwargs": {
        "modification_factory_kwargs": {
            "SequentialModificationFactory": {
                "num_total_steps": 128, "modifications": ["disable_cars"], "switching_thresholds": []},
            "AllCombinationsRandomModificationFactory": {
                "num_total_steps": 128,
                "modifications": [["all_green_cars", "all_pink_cars", "all_white_cars", "all_blue_cars"],
                                  ["", "reverse_car_speed_bottom", "reverse_car_speed_top"]],
                "num_repetitions": 20},
        },
        "epsilon": 0.005,
    },
}


def train(tmp, name: str, *flags: str, config: str = "run_config.json", total: str = "128"):
    runs = str(tmp / "runs")
    proc = run_script("continual_training_example.py", "--config", config, *flags, *TINY, "--total_timesteps", total,
                      "--runs_dir", runs, "--run_name", name)
    return os.path.join(runs, name), proc


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """The seed's training command."""
    tmp = tmp_path_factory.mktemp("seed_train")
    return train(tmp, "base", "--env_id", "ALE/Freeway-v5", "--backend", "HackAtari", "--architecture", "PPO",
                 "--track", "--capture_video")


@pytest.fixture(scope="module")
def her_run(tmp_path_factory):
    """The seed's HER section: `--her`, optionally `--game_specific_goals`."""
    tmp = tmp_path_factory.mktemp("seed_her")
    return train(tmp, "her", "--env_id", "ALE/Freeway-v5", "--backend", "HackAtari", "--her", "--game_specific_goals")


def test_train_command(base_run):
    run_dir, proc = base_run
    assert os.path.exists(os.path.join(run_dir, "ppo.cleanrl_model"))  # the seed's runs/.../<name>.cleanrl_model
    assert glob.glob(os.path.join(run_dir, "checkpoints", "final__step*.cleanrl_model"))
    assert glob.glob(os.path.join(run_dir, "videos", "*.mp4"))
    assert glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_seed_run_config_example(tmp_path):
    cfg = write_config(tmp_path, SEED_EXAMPLE_CONFIG)
    run_dir, _ = train(tmp_path, "example", config=str(cfg), total="256")
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["modification_factory"] == "EpsCombinedModificationFactory"
    assert "disable_cars" in config["possible_modifications"]


# the seed's contract: num_total_steps (+ kwargs) and get_modification(step); one switch every 64 steps
SEED_STYLE_CLASS = ("class {name}:\n"
                    "    def __init__(self, num_total_steps, modifications):\n"
                    "        self.num_total_steps, self.modifications = num_total_steps, modifications\n"
                    "    def get_modification(self, step):\n"
                    "        return self.modifications[(step // 64) % len(self.modifications)]\n\n\n")


def test_custom_factory_registered_in_the_mapping(tmp_path):
    """The seed's 'Custom Modification Factories': a class with num_total_steps and get_modification(step),
    registered in modification_factory_mapping, referenced from run_config.json."""
    plugin = tmp_path / "my_factories.py"
    plugin.write_text(
        "import modification_factories as mf\n\n" + SEED_STYLE_CLASS.format(name="MyFactory")
        + "mf.modification_factory_mapping['MyFactory'] = MyFactory\n")
    cfg = write_config(tmp_path, {"modification_factory": "MyFactory", "modification_factory_kwargs": {
        "num_total_steps": 128, "modifications": ["", "all_green_cars"]}})
    boot = tmp_path / "train_with_plugin.py"
    boot.write_text("import runpy, sys\nsys.path.insert(0, %r)\nsys.path.insert(0, %r)\nimport my_factories\n"
                    "sys.argv[0] = 'continual_training_example.py'\n"
                    "runpy.run_path(%r, run_name='__main__')\n"
                    % (ROOT, str(tmp_path), os.path.join(ROOT, "continual_training_example.py")))
    runs = str(tmp_path / "runs")
    run_script(str(boot), "--config", str(cfg), *TINY, "--runs_dir", runs, "--run_name", "mine")
    switches = [json.loads(ln) for ln in open(os.path.join(runs, "mine", "metrics.jsonl"))
                if '"switch"' in ln]
    assert [s["modification"] for s in switches] == ["all_green_cars"]


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_custom_factory_written_into_modification_factories_py(tmp_path):
    """The seed's instructions taken literally: the class is written into modification_factories.py itself (a copy
    of this repository) and registered there in modification_factory_mapping."""
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if f.endswith(".py") or f.endswith(".json"):
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(ROOT, f), repo / f)
    with open(repo / "modification_factories.py", "a") as fh:
        fh.write("\n\n" + SEED_STYLE_CLASS.format(name="EveryOtherRollout")
                 + "modification_factory_mapping['EveryOtherRollout'] = EveryOtherRollout\n")
    cfg = write_config(tmp_path, {"modification_factory": "EveryOtherRollout", "modification_factory_kwargs": {
        "num_total_steps": 192, "modifications": ["", "all_green_cars"]}})
    runs = str(tmp_path / "runs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(repo / "continual_training_example.py"), "--config", str(cfg), *TINY,
                           "--runs_dir", runs, "--run_name", "edited"], cwd=str(repo), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    switches = [json.loads(ln)["modification"] for ln in open(os.path.join(runs, "edited", "metrics.jsonl"))
                if '"switch"' in ln]
    assert switches == ["all_green_cars", ""]


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_config_keys_and_flags_precedence_note(tmp_path):
    """The seed: 'extra keys in run_config.json override CLI flags'. Here flags win, and a note line says so."""
    cfg = write_config(tmp_path, {**SEED_EXAMPLE_CONFIG, "total_timesteps": 256, "env_id": "ALE/Freeway-v5"})
    run_dir, proc = train(tmp_path, "prec", "--env_id", "ALE/Freeway-v5", config=str(cfg), total="128")
    assert json.load(open(os.path.join(run_dir, "config.json")))["resolved_total_timesteps"] == 128
    said = proc.stdout + proc.stderr
    assert "note" in said.lower() and "total_timesteps" in said


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_her_commands(her_run):
    run_dir, _ = her_run
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["her"] and config["game_specific_goals"]
    assert os.path.exists(os.path.join(run_dir, "ppo.cleanrl_model"))


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_ppo_cbp_command(tmp_path):
    run_dir, _ = train(tmp_path, "cbp", "--env_id", "ALE/Freeway-v5", "--backend", "HackAtari", "--architecture",
                       "PPO_CBP", "--replacement_rate", "1e-4", "--init", "kaiming", "--maturity_threshold", "100",
                       "--decay_rate", "0.99")
    assert os.path.exists(os.path.join(run_dir, "ppo_cbp.cleanrl_model"))


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_shrink_and_perturb_checkpoints_and_wandb_commands(tmp_path):
    cfg = write_config(tmp_path, SEED_EXAMPLE_CONFIG)
    run_dir, _ = train(tmp_path, "sp", "--shrink_and_perturb", "--shrink_factor", "0.7", "--noise_scale", "0.01",
                       "--save_agent_with_switch", "--track", "--save_agent_wandb", "--wandb_project_name", "seed",
                       "--wandb_dir", str(tmp_path / "wandb_cache"), config=str(cfg), total="256")
    assert glob.glob(os.path.join(run_dir, "checkpoints", "switch__*.cleanrl_model"))
    assert glob.glob(os.path.join(str(tmp_path / "wandb_cache"), "wandb", "offline-run-*"))


def test_eval_command(base_run, tmp_path):
    """`python eval.py --agent_path runs/.../model.cleanrl_model --env_id ALE/Freeway-v5 --backend HackAtari
    --eval_episodes 50 --capture_video` (2 games here, capped at 30 steps by --eval_max_episode_steps)."""
    run_dir, _ = base_run
    out = str(tmp_path / "ev")
    run_script("eval.py", *EVAL_TINY, "--agent_path", os.path.join(run_dir, "ppo.cleanrl_model"),
               "--env_id", "ALE/Freeway-v5",
               "--backend", "HackAtari", "--eval_episodes", "2", "--capture_video", "--output", out)
    rows = json.load(open(out + ".json"))["results"]
    assert [r["modification"] for r in rows] == [""] and rows[0]["episodes"] == 2
    assert glob.glob(out + "__videos/*.mp4")


def test_eval_under_a_modification_with_wandb(base_run, tmp_path):
    run_dir, _ = base_run
    out = str(tmp_path / "mod")
    run_script("eval.py", *EVAL_TINY, "--agent_path", os.path.join(run_dir, "ppo.cleanrl_model"),
               "--env_id", "ALE/Freeway-v5",
               "--backend", "HackAtari", "--modifs", "all_green_cars reverse_car_speed_top", "--eval_episodes", "1",
               "--track", "--wandb_project_name", "seed", "--wandb_dir", str(tmp_path), "--output", out)
    rows = json.load(open(out + ".json"))["results"]
    assert [r["modification"] for r in rows] == ["all_green_cars reverse_car_speed_top"]
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*"))


def test_eval_attached_to_the_training_run(base_run, tmp_path):
    run_dir, _ = base_run
    wandb_id = os.path.basename(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))[0]).rsplit("-", 1)[1]
    out = str(tmp_path / "attached")
    run_script("eval.py", *EVAL_TINY, "--agent_path", os.path.join(run_dir, "ppo.cleanrl_model"),
               "--eval_episodes", "1",
               "--track", "--wandb_run_id", wandb_id, "--wandb_dir", str(tmp_path), "--output", out)
    assert os.path.exists(out + ".json")


@pytest.mark.slow  # the default suite keeps train, custom factory and eval; these run with -m slow
def test_eval_her_command(her_run, tmp_path):
    run_dir, _ = her_run
    out = str(tmp_path / "her")
    run_script("eval.py", *EVAL_TINY, "--agent_path", os.path.join(run_dir, "ppo.cleanrl_model"),
               "--env_id", "ALE/Freeway-v5",
               "--backend", "HackAtari", "--her", "--game_specific_goals", "--eval_episodes", "1", "--output", out)
    result = json.load(open(out + ".json"))
    assert "success_rate" in result["results"][0] and result["her"]["game_specific_goals"] is True
