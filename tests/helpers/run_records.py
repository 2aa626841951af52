"""Two run directories compared as records (tests/test_agents_dqn_seeds.py, tests/test_launch.py): every record of
metrics.jsonl but its timings, the evaluation table, config.json and every checkpoint, bit for bit."""

from __future__ import annotations

import csv
import glob
import json
import os
from typing import Sequence

import torch

from continual.training.tracking import read_metrics

VARYING = ("time", "seconds", "eval_seconds", "total_seconds", "time_share", "charts/SPS", "time/env_s", "time/learn_s",
           "time/act_s", "code_revision")


def records(run: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VARYING} for r in read_metrics(os.path.join(run, "metrics.jsonl"))]


def eval_rows(run: str) -> list[dict]:
    with open(os.path.join(run, "eval_table.csv"), newline="") as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def same(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b or (a != a and b != b), where  # NaN == NaN


def assert_same_run(run: str, alone: str, differ: Sequence[str] = ("run_name",)) -> list[dict]:
    """`run` learned what `alone` learned: its records (returned), evaluation table, config.json and checkpoints
    (weights, optimizer state, generators) are the same but for the configuration keys `differ` and the timings."""
    got = records(run)
    assert got == records(alone)
    if os.path.exists(os.path.join(alone, "eval_table.csv")):
        assert eval_rows(run) == eval_rows(alone)
    configs = []
    for folder in (run, alone):
        with open(os.path.join(folder, "config.json")) as f:
            configs.append({k: v for k, v in json.load(f).items() if k not in (*differ, "code_revision")})
    assert configs[0] == configs[1]
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(run, "checkpoints", "*")))
    assert names == sorted(os.path.basename(p) for p in glob.glob(os.path.join(alone, "checkpoints", "*")))
    for name in names:
        a, b = (torch.load(os.path.join(f, "checkpoints", name), weights_only=False) for f in (run, alone))
        for state in (a, b):
            for key in differ:
                state["args"].pop(key)
            del state["rng"]["torch"], state["rng"]["python"]  # the process's globals, never drawn in the loop
            state.pop("wandb_id", None)
        same(a, b, name)
    return got
