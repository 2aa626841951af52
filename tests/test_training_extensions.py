"""Continual behaviour is pinned (tests/helpers/extension_reference.py): every agent with the continual methods it
supports plays the same games, logs the same scalars and evaluation table, writes checkpoints of the same structure
and reaches the same weights as the recording made before the extension interface (issue 50)."""

from __future__ import annotations

import json

import pytest
from helpers.extension_reference import CASES, DATA, FAST, run_case

with open(DATA) as f:
    RECORDED = json.load(f)


def test_every_case_is_recorded_and_the_recording_is_small():
    import os

    assert sorted(RECORDED["cases"]) == sorted(CASES)
    assert os.path.getsize(DATA) < 200_000


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == FAST else pytest.mark.slow) for c in CASES])
def test_the_case_behaves_as_recorded(tmp_path, case):
    expected, got = RECORDED["cases"][case], run_case(case, str(tmp_path))
    assert got["episodes"] == expected["episodes"], "episodes"
    for i, (g, e) in enumerate(zip(got["records"], expected["records"])):
        assert g == e, f"record {i}: {g} != {e}"
    assert len(got["records"]) == len(expected["records"]), "records"
    assert got["names"] == expected["names"], "the scalars logged"
    assert got["eval_table"] == expected["eval_table"], "evaluation table"
    assert got["checkpoints"] == expected["checkpoints"], "checkpoints"
    assert got["weights"] == expected["weights"], "final weights"
