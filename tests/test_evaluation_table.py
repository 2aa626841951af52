"""continual.evaluation.table.read_no_agent_eval: the one reader of eval.py's JSON of an evaluation in which no agent
acted (the robustness report's constant action, the C-CHAIN report's random actions)."""

from __future__ import annotations

import json

import pytest

from continual.errors import UserError
from continual.evaluation.table import read_no_agent_eval


def test_rows_by_normalised_modification_and_action_0_is_an_action(tmp_path):
    path = tmp_path / "e.json"
    rows = [{"modification": "", "episodes": 3, "mean": 1.0}, {"modification": "env=MinAtar/Asterix", "episodes": 3,
                                                                 "mean": 0.5}]
    path.write_text(json.dumps({"constant_action": 0, "results": rows}))
    data, by = read_no_agent_eval(str(path), "constant_action")
    assert data["constant_action"] == 0 and by == {"": rows[0], "env=MinAtar/Asterix": rows[1]}


@pytest.mark.parametrize("content, words", [
    ("{", "cannot read an eval.py JSON"),
    (json.dumps({"greedy": True, "results": [{"modification": "", "episodes": 1, "mean": 0}]}),
     "not an evaluation with --random_actions"),
    (json.dumps({"random_actions": False, "results": [{"modification": "", "episodes": 1, "mean": 0}]}),
     "not an evaluation with --random_actions"),
    (json.dumps({"random_actions": True, "results": []}), "not an evaluation with --random_actions"),
    (json.dumps([1, 2]), "not an evaluation with --random_actions"),
])
def test_anything_else_is_one_line_naming_baseline(tmp_path, content, words):
    path = tmp_path / "e.json"
    path.write_text(content)
    with pytest.raises(UserError) as e:
        read_no_agent_eval(str(path), "random_actions")
    assert words in str(e.value) and str(e.value).startswith("--baseline ") and "\n" not in str(e.value)
