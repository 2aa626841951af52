"""continual/curricula/preview.py: `python modification_factories.py CONFIG` prints the schedule (table, plain text
without rich), the README config at the default granularity, a user factory at the rollout size, bad input as one
error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import modification_factories as mf
from conftest import write_config
from helpers.curricula_cases import (
    README_CONFIG,
    SEED_MODS,
    SEQ_OK,
    seq,
)
from modification_factories import make_factory

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "modification_factories.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_table(tmp_path: Path) -> None:
    config = {
        "modification_factory": "Combined",
        "modification_factory_kwargs": {
            "modification_factory_kwargs": [
                seq("Sequential", num_total_steps=100, modifications=["all_green_cars reverse_car_speed_top"], switching_thresholds=[]),
                seq("NoModification", num_total_steps=50),
            ]
        },
        "seed": 3,
        "num_envs": 2,
        "num_steps": 25,
        "learning_rate": 0.1,
    }
    path = write_config(tmp_path, config, "config.json")
    result = run_cli(str(path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    first_line = out.splitlines()[0]
    # As training builds it: built-ins decide per step whatever num_envs * num_steps (50) is, and the preview says so.
    assert "Combined" in first_line and "150" in first_line and "granularity 1," in first_line
    assert out.splitlines()[1].startswith("rule: built-in factories decide per step")
    assert "seed 3" in first_line and "1 switches" in first_line
    assert "all_green_cars reverse_car_speed_top" in out
    assert "(none)" in out
    for column in ("start", "end", "steps", "modification"):
        assert column in out
    assert "possible modifications" in out

    overridden = run_cli(str(path), "--granularity", "40", "--seed", "9", "--max-rows", "1")
    assert overridden.returncode == 0, overridden.stderr
    assert "granularity 40" in overridden.stdout and "seed 9" in overridden.stdout
    assert "more rows" in overridden.stdout


def test_cli_readme_config_default_granularity(tmp_path: Path) -> None:
    path = write_config(tmp_path, README_CONFIG, "readme.json")
    result = run_cli(str(path))
    assert result.returncode == 0, result.stderr
    assert "granularity 1," in result.stdout and "seed 1" in result.stdout
    assert "the same under PPO and IMPALA" in result.stdout
    assert "disable_cars" in result.stdout


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"modification_factory_kwargs": {"num_total_steps": 3}}),
        json.dumps({"modification_factory": "Bogus", "modification_factory_kwargs": {}}),
        json.dumps({"modification_factory": "Sequential", "modification_factory_kwargs": {**SEQ_OK, "switching_thresholds": [10, 5]}}),
        json.dumps({"modification_factory": "NoModification", "modification_factory_kwargs": {"num_total_steps": 3}, "seed": "x"}),
        json.dumps({"modification_factory": "NoModification", "modification_factory_kwargs": {"num_total_steps": 3}, "num_envs": 0, "num_steps": 4}),
        None,  # missing file
    ],
)
def test_cli_bad_input_single_error_line(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    result = run_cli(str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr


def test_preview_plain_text_without_rich(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for module in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, module, None)  # makes "from rich... import" fail
    f = make_factory("Sequential", {"num_total_steps": 10, "modifications": ["", "b a"], "switching_thresholds": [4]}, granularity=2)
    from continual.curricula.preview import _print_preview

    _print_preview(f, "Sequential", max_rows=0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Sequential: total 10 steps, granularity 2, seed 0, 1 switches"
    assert lines[1] == mf.granularity_rule(f)
    assert lines[2].split() == ["start", "end", "steps", "modification"]
    assert lines[3].split() == ["0", "4", "4", "(none)"]
    assert lines[4].split() == ["4", "10", "6", "a", "b"]
    assert lines[5] == "possible modifications (2):"


def test_cli_user_factory_preview_uses_the_rollout_size(seed_style_file: Path, tmp_path: Path) -> None:
    path = write_config(tmp_path, {"modification_factory": f"{seed_style_file}:SeedStyleFactory", "num_envs": 2,
                                   "num_steps": 16, "modification_factory_kwargs": {"num_total_steps": 320,
                                                                                    "modifications": SEED_MODS}},
                        "user.json")
    result = run_cli(str(path))
    assert result.returncode == 0, result.stderr
    assert "granularity 32," in result.stdout
    assert "rule: your factory is asked once per rollout, at steps 0, 32, 64, ..." in result.stdout
