"""Benchmark: the cost of the default periodic checkpoints (--checkpoint_minutes 5).

Builds what a default run checkpoints (run_config.json: PPO, Nature CNN on 4x84x84 Freeway frames, Adam state
filled by one update, the plasticity probe batch, the factory, RNG and reward-scaler state) and times
`RunSession.save`, the production path (payload, torch.save to a temporary file, fsync, rename, pruning to
--keep_checkpoints), `--repeats` times. Reported: seconds per checkpoint (median, max), file size, and the share of
training time at the default interval, t / (60 x checkpoint_minutes) (one checkpoint per interval of training; the
final checkpoint is written either way).

    python bench/checkpoint_cost.py [--config run_config.json] [--repeats 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import common  # noqa: F401  (puts the repository root on sys.path)
import torch

from agents import ppo
from continual.config.args import Args
from continual.config.loading import parse_args
from continual.envs.vector import EnvSettings, make_vector_env
from continual.plasticity.diagnostics import PlasticityMonitor
from continual.training.rewards import RewardScaler
from continual.training.startup import start_run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(common.REPO_ROOT, "run_config.json"))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", default=None)
    opts = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        args, curriculum = parse_args(["--config", opts.config, "--runs_dir", tmp, "--run_name", "bench",
                                       "--no-progress-bar", "--no-cuda"])
        session = start_run(args, curriculum, None, granularity=args.rollout_size())
        envs = make_vector_env(EnvSettings.from_args(args), 1, session.modification, "sync")
        try:
            agent = ppo.make_agent(envs.single_observation_space, int(envs.single_action_space.n), args)
            obs_shape = envs.single_observation_space.shape
        finally:
            envs.close()
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
        # one update, so that Adam's moments (2 x the weights) are in the checkpoint as in a real run
        x = torch.randint(0, 255, (8, *obs_shape), dtype=torch.uint8)
        _, logp, ent, value = agent.get_action_and_value(x)
        (value.sum() - logp.sum() - ent.sum()).backward()
        optimizer.step()
        scaler = RewardScaler(args.reward_scaling, args.num_envs, args.gamma)
        monitor = PlasticityMonitor(session, agent)  # keeps a probe batch from the first rollout (saved too)
        monitor.observe(torch.randint(0, 255, (args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8))
        session.register("model", agent.state_dict)  # what PPO's checkpoints hold
        session.register("optimizer", optimizer.state_dict)
        session.register("reward_scaler", scaler.state_dict)
        session.register("plasticity", monitor.state_dict)
        session.describe_policy(agent)
        times, size = [], 0
        try:
            for i in range(opts.repeats):
                session.global_step = (i + 1) * args.rollout_size()
                t0 = time.perf_counter()
                path = session.save(f"periodic__step{session.global_step}")
                times.append(time.perf_counter() - t0)
                size = os.path.getsize(path)
            kept = len([f for f in os.listdir(session.checkpoint_dir) if f.startswith("periodic__")])
        finally:
            session.close()

    interval_s = 60.0 * Args().checkpoint_minutes
    med, worst = common.median(times), max(times)
    result = {"machine": common.machine_info(), "loadavg": common.loadavg(), "repeats": opts.repeats,
              "seconds": times, "median_s": med, "max_s": worst, "bytes": size, "kept_periodic": kept,
              "interval_s": interval_s, "share_of_training_median": med / interval_s,
              "share_of_training_max": worst / interval_s}
    common.print_table(f"checkpoint cost ({opts.repeats} saves, load {common.loadavg()})",
                       ["what", "value"],
                       [["file size", f"{size / 2**20:.1f} MiB"],
                        ["seconds per checkpoint (median)", f"{med:.3f}"],
                        ["seconds per checkpoint (max)", f"{worst:.3f}"],
                        ["periodic checkpoints kept", kept],
                        ["default interval", f"{interval_s:.0f} s"],
                        ["share of training time (median)", f"{100 * med / interval_s:.3f}%"],
                        ["share of training time (max)", f"{100 * worst / interval_s:.3f}%"]])
    common.write_json(opts.json, result)


if __name__ == "__main__":
    main()
