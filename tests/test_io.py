"""continual.io: atomic writes (old content or new, never a mix, no temporary file left by an exception; a SIGKILL
between fsync and rename leaves the old content) and the JSONL rule (a cut last line is dropped, a damaged line
elsewhere is an error). Also the readers that replaced several copies: metrics.jsonl and eval_table.csv."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys

import pytest

from continual import io as cio
from continual.errors import StorageError, UserError
from continual.evaluation import metrics, table
from continual.training import tracking
from helpers.trainer_faults import ROOT, faulty

WRITERS = {
    "bytes": lambda p: cio.atomic_write_bytes(p, b"new"),
    "text": lambda p: cio.atomic_write_text(p, "new"),
    "json": lambda p: cio.atomic_write_json(p, {"new": 1}),
    "csv": lambda p: cio.atomic_write_csv(p, ["a"], [{"a": 1}]),
    "tracking.write_json": lambda p: tracking.write_json(p, {"new": 1}),
    "metrics._write_json": lambda p: metrics._write_json(p, {"new": 1}),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path, monkeypatch, name, where):
    path = tmp_path / "f"
    path.write_text("old")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    if where == "write":  # the failure in the middle of the payload: the json/csv/bytes writer itself
        real_open = open

        def failing_open(file, mode="r", *a, **k):
            f = real_open(file, mode, *a, **k)
            if "x" in mode:
                f.write = boom
            return f

        monkeypatch.setattr("builtins.open", failing_open)
    else:
        monkeypatch.setattr(os, where, boom)
    with pytest.raises((OSError, StorageError)):  # the training process's writers name the file (StorageError)
        WRITERS[name](str(path))
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["f"]


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_write_replaces_the_file_and_leaves_nothing_else(tmp_path, name):
    path = tmp_path / "f"
    path.write_text("old")
    WRITERS[name](str(path))
    assert path.read_bytes() != b"old"
    assert sorted(os.listdir(tmp_path)) == ["f"]
    assert (path.stat().st_mode & 0o777) == (0o666 & ~_umask())  # as a plain open() would create it


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_sigkill_between_fsync_and_rename_keeps_the_old_checkpoint(tmp_path):
    """A checkpoint write killed between fsync and rename (tests/helpers/trainer_faults.py: CONTINUAL_FAULT=
    checkpoint_write): the process dies with the new file complete but not renamed; the old file is intact, the
    temporary one is `.tmp-*` (removed by remove_partial_writes at resume)."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    path = folder / "x.cleanrl_model"
    path.write_bytes(b"old")
    script = tmp_path / "write.py"
    script.write_text(f"import sys; sys.path.insert(0, {ROOT!r}); from continual import io; "
                      "io.atomic_write_bytes(sys.argv[1], b'new')")
    env = {"CONTINUAL_FAULT": "checkpoint_write:1"}
    proc = subprocess.run([sys.executable, *faulty([str(script), str(path)], env)], env={**os.environ, **env})
    assert proc.returncode == -9
    assert path.read_bytes() == b"old"
    leftovers = [n for n in os.listdir(folder) if n != path.name]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-") and leftovers[0].endswith(".cleanrl_model")
    assert (folder / leftovers[0]).read_bytes() == b"new"
    from continual.training.checkpoint import remove_partial_writes

    remove_partial_writes(str(folder))
    assert os.listdir(folder) == [path.name]


# --- JSONL -------------------------------------------------------------------------------------------------------------
RECORDS = [{"kind": "iteration", "global_step": 8}, {"kind": "switch", "global_step": 16, "modification": "a"},
           {"kind": "iteration", "global_step": 24}]


def _jsonl(tmp_path, tail: str = "", middle: str = "") -> str:
    lines = [json.dumps(RECORDS[0]) + "\n", middle, *[json.dumps(r) + "\n" for r in RECORDS[1:]], tail]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(lines))
    return str(path)


@pytest.mark.parametrize("tail", ['{"kind": "episode", "glo', '{"kind": "ep\n', "\x00\x00\x00\x00", "12"])
def test_jsonl_a_cut_last_line_is_dropped(tmp_path, tail):
    path = _jsonl(tmp_path, tail=tail)
    assert cio.read_jsonl(path) == RECORDS
    assert tracking.read_metrics(path) == RECORDS
    assert [v.start for v in metrics.load_run(str(tmp_path)).visits] == [0, 16]


@pytest.mark.parametrize("middle", ['{"kind": "episode", "glo\n', "garbage\n", "[1, 2]\n",
                                    '{"kind": "episode"}, {"kind": "episode"}\n', '{"kind": "episode", "a": [1\n'])
def test_jsonl_a_damaged_line_elsewhere_is_an_error_naming_it(tmp_path, middle):
    path = _jsonl(tmp_path, middle=middle)
    for read in (cio.read_jsonl, tracking.read_metrics):
        with pytest.raises(UserError, match=r"metrics.jsonl:2: not a JSON record"):
            read(path)


def test_jsonl_blank_lines_and_a_missing_file(tmp_path):
    assert cio.read_jsonl(str(tmp_path / "none.jsonl")) == []
    path = _jsonl(tmp_path, middle="\n  \n")
    assert cio.read_jsonl(path) == RECORDS


@pytest.mark.parametrize("tail", ["", '{"kind": "episode", "glo'])
def test_jsonl_gzipped_copy_is_read_when_the_file_is_absent_same_rule(tmp_path, tail):
    """An archived run keeps metrics.jsonl.gz (continual.launch.archive): read under the plain name, same rule."""
    path = _jsonl(tmp_path, tail=tail)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        g.write(f.read())
    os.unlink(path)
    assert cio.read_jsonl(path) == tracking.read_metrics(path) == RECORDS
    assert [v.start for v in metrics.load_run(str(tmp_path)).visits] == [0, 16]


def test_truncate_metrics_follows_the_rule(tmp_path):
    """Resuming keeps the records up to the checkpoint's step, drops a cut last line, refuses a damaged file."""
    path = _jsonl(tmp_path, tail='{"kind": "episode", "glo')
    tracking.truncate_metrics(path, 8)
    assert open(path).read() == json.dumps(RECORDS[0]) + "\n"
    path = _jsonl(tmp_path, middle="garbage\n")
    with pytest.raises(UserError):
        tracking.truncate_metrics(path, 8)


# --- eval_table.csv ----------------------------------------------------------------------------------------------------
def test_eval_table_one_reader_for_training_metrics_and_plots(tmp_path):
    """The reader of continual.evaluation.continual (typed, NaN for empty) is now metrics' and plots' too; the old
    metrics copy converted step and mean only."""
    from continual.evaluation import continual as ceval
    from continual.evaluation import plots

    path = tmp_path / table.EVAL_TABLE
    cio.atomic_write_csv(str(path), table.COLUMNS, [
        {"step": 0, "modification": "b a", "slug": "a_b", "split": "curriculum", "episodes": 4, "mean": 1.5,
         "std": 0.5, "min": 1, "max": 2, "mean_length": 10, "seconds": 0.1, "greedy": False, "success_rate": ""},
        {"step": 8, "modification": "", "slug": "none", "split": "heldout", "episodes": 2, "mean": -1, "std": "",
         "min": -1, "max": -1, "mean_length": 3, "seconds": 0.2, "greedy": False, "success_rate": 0.5}])
    assert ceval.read_eval_table is table.read_eval_table and metrics.read_eval_table is table.read_eval_table
    rows = table.read_eval_table(str(path))
    assert [(r["step"], r["episodes"], r["mean"], r["min"]) for r in rows] == [(0, 4, 1.5, 1.0), (8, 2, -1.0, -1.0)]
    assert math.isnan(rows[0]["success_rate"]) and rows[1]["success_rate"] == 0.5 and math.isnan(rows[1]["std"])
    assert rows[0]["max_episode_steps"] is None and rows[0]["capped"] is None  # a table written before the columns
    std, games = plots._eval_std(str(tmp_path))
    assert std[("a b", 0)] == 0.5 and math.isnan(std[("", 8)]) and games == {2, 4}
    assert table.keep_rows_until(str(path), 0) == {0}
    assert [r["step"] for r in table.read_eval_table(str(path))] == [0]
    assert sorted(os.listdir(tmp_path)) == [table.EVAL_TABLE]
