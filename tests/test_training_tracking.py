"""W&B logging, offline (WANDB_MODE=offline): the run's records are read back from the offline `run-*.wandb` file.

The file is wandb's LevelDB-style log (a 7-byte header, 32 KiB blocks of records with a crc32/length/type header,
records split over blocks as FIRST/MIDDLE/LAST); each record is a `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Iterator

import pytest
import torch

from conftest import run_main, run_script
from continual.config.loading import parse_args
from continual.errors import UserError


def wandb_records(path: str) -> Iterator["object"]:
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"{path} is not a W&B log ({ident!r})"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL, FIRST start a record; MIDDLE, LAST continue it
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    runs = str(tmp_path_factory.mktemp("wandb") / "runs")
    run_script("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2",
               "--num_steps", "32", "--total_timesteps", "128", "--runs_dir", runs, "--run_name", "w", "--track",
               "--save_agent_wandb", "--capture_video", "--no-progress-bar", timeout=600)
    run_dir = os.path.join(runs, "w")
    logs = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(logs) == 1, logs
    return run_dir, list(wandb_records(logs[0]))


def test_every_video_reaches_wandb_the_last_one_included(tracked_run):
    """The last video is finished when the envs close, after the last iteration: it must be logged too."""
    run_dir, records = tracked_run
    on_disk = sorted(os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "videos", "*.mp4")))
    assert len(on_disk) >= 2, "the run should record several CartPole games"
    logged = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {tuple(it.nested_key): it.value_json for it in r.history.item}
            logged += [int(v) for k, v in items.items() if k[0].startswith("videos/") and k[-1] == "size"]
    assert sorted(logged) == on_disk


def test_effective_exp_name_in_wandb_config_json_and_checkpoints(tracked_run):
    """No --exp_name: the name used in the run name (the architecture, lower case) is what every record says."""
    run_dir, records = tracked_run
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert runs and runs[0].display_name == "w"
    config = {u.key: json.loads(u.value_json) for u in runs[0].config.update}
    assert config["exp_name"] == "ppo" and config["run_name"] == "w"
    assert json.load(open(os.path.join(run_dir, "config.json")))["exp_name"] == "ppo"
    state = torch.load(os.path.join(run_dir, "checkpoints", "final__step128.cleanrl_model"), weights_only=True)
    assert state["args"]["exp_name"] == "ppo"
    # the W&B run id a --resume continues, and the offline run's folder is named after it
    (offline,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))
    assert state["wandb_id"] and state["wandb_id"] in offline
    artifacts = [r.artifact.name for r in records if r.WhichOneof("record_type") == "artifact"]
    assert artifacts == ["w__final__step128"]  # --save_agent_wandb


def test_default_run_name_uses_the_effective_exp_name(tmp_path):
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2",
             "--num_steps", "32", "--total_timesteps", "64", "--runs_dir", runs, "--architecture", "PPO_CBP",
             "--no-progress-bar")
    (name,) = os.listdir(runs)
    assert name.startswith("CartPole__ppo_cbp__s1__")
    assert json.load(open(os.path.join(runs, name, "config.json")))["exp_name"] == "ppo_cbp"


def test_save_agent_wandb_without_track_is_an_error():
    with pytest.raises(UserError, match="save_agent_wandb.*--track"):
        parse_args(["--save_agent_wandb"])
    args, _ = parse_args(["--save_agent_wandb", "--track"])
    assert args.save_agent_wandb and args.track


def test_wandb_group_tags_and_final_metrics_in_the_summary(tmp_path):
    """--wandb_group/--wandb_tags reach wandb.init; the end-of-run metrics (average performance, forgetting, transfer)
    land in the W&B summary, equal to metrics.json's."""
    runs = str(tmp_path / "runs")
    run_script("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2",
               "--num_steps", "32", "--total_timesteps", "128", "--runs_dir", runs, "--run_name", "g", "--track",
               "--wandb_group", "exp-7", "--wandb_tags", "grid, seed1", "--eval_every", "64", "--eval_episodes", "1",
               "--no-progress-bar", timeout=600)
    run_dir = os.path.join(runs, "g")
    (log,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    records = list(wandb_records(log))
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_group == "exp-7" and list(run.tags) == ["grid", "seed1"]
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in r.summary.update})
    final = json.load(open(os.path.join(run_dir, "metrics.json")))["summary"]
    assert final["final"] is not None and summary["final_metrics/final"] == pytest.approx(final["final"])
    assert summary["final_metrics/average"] == pytest.approx(final["average"])


def test_a_failed_tensorboard_write_warns_once_and_the_metrics_go_on(tmp_path, capsys):
    import errno

    from continual.training.tracking import RunLogger, read_metrics

    logger = RunLogger(str(tmp_path), {"a": 1})
    calls = []

    def full(*a, **k):
        calls.append(a)
        raise OSError(errno.ENOSPC, "No space left on device")

    logger.writer._target._get_file_writer = full
    for step in (1, 2, 3):
        logger.scalars({"charts/x": 1.0}, step)
        logger.record("iteration", step)
    logger.close()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(calls) == 1  # not tried again: a failed writer's thread is dead
    assert len(err) == 1 and err[0].startswith("warning: TensorBoard write failed") and "No space left" in err[0]
    assert [r["global_step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2, 3]


def test_the_event_file_kept_open_holds_tensorboards_own_bytes(tmp_path):
    """keep_event_file_open: the records TensorBoard's GFile would have written (byte for byte after the first, which
    holds the file's creation time), in the file TensorBoard reads, flushed by `flush()`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from continual.training.tracking import _KeptOpenEventFile, keep_event_file_open

    files = {}
    for kept in (False, True):
        folder = tmp_path / str(kept)
        writer = SummaryWriter(str(folder))
        if kept:
            keep_event_file_open(writer)
            assert isinstance(writer.file_writer.event_writer._async_writer._writer._writer, _KeptOpenEventFile)
        for i in range(300):
            writer.add_scalar("charts/episodic_return", float(i % 7), i * 64, walltime=1000.0 + i)
            writer.add_scalar("charts/episodic_length", i, i * 64, walltime=1000.0 + i)
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n|a|1|", 0, walltime=2000.0)
        writer.flush()
        acc = EventAccumulator(str(folder))
        acc.Reload()
        assert [e.step for e in acc.Scalars("charts/episodic_length")] == [i * 64 for i in range(300)]
        writer.close()
        (path,) = glob.glob(str(folder / "events.out.tfevents.*"))
        files[kept] = open(path, "rb").read()

    def after_first_record(data: bytes) -> bytes:
        return data[8 + 4 + struct.unpack("<Q", data[:8])[0] + 4:]

    assert after_first_record(files[True]) == after_first_record(files[False])


def test_events_framed_together_are_tensorboards_own_records_byte_for_byte():
    """tf_records (the gathered events written in one go): the bytes of TensorBoard's RecordWriter, record by record
    (length, its masked CRC-32C, the data, the data's masked CRC-32C), for batches of events of mixed lengths (a
    game's, an iteration's, empty, one long one, one alone)."""
    import io
    import random

    from tensorboard.summary.writer.record_writer import RecordWriter

    from continual.training.tracking import scalar_event, tf_records

    rng = random.Random(0)
    game = {"charts/episodic_return": 2.0, "charts/episodic_length": 31, "episodic_return_by_modif/no_modif": 2.0}
    batches = [[scalar_event(game, 64 * i) for i in range(400)]
               + [scalar_event({f"losses/x{k}": k / 3 for k in range(20)}, 25_600)],
               [], [b""], [b"x" * 3000], [bytes([255]) * 9, b"a"]]
    batches += [[rng.randbytes(rng.choice([0, 1, 8, 100, 119, 120, 500])) for _ in range(rng.choice([1, 3, 7, 50]))]
                for _ in range(40)]
    for events in batches:
        reference = io.BytesIO()
        writer = RecordWriter(reference)
        for data in events:
            writer.write(data)
        assert tf_records(events) == reference.getvalue()


def test_a_scalar_event_is_protobufs_serialization_byte_for_byte():
    """scalar_event writes out the Event protobuf would serialize: wall time, step (0 and large), every value's tag
    (ASCII and not, long, empty) and float32 simple value (rounded, 0, -0, tiny, infinite, NaN, beyond float32's
    range, an int)."""
    import random

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    from continual.training.tracking import scalar_event

    rng = random.Random(1)
    specials = [0.0, -0.0, 1e-45, 3.4e38, 1e39, -1e300, float("inf"), -float("inf"), float("nan"), 7, 1 / 3]
    tags = ["charts/episodic_return", "episodic_return_by_modif/gravity=15", "é/ü", "x" * 300, ""]
    for i in range(300):
        values = {rng.choice(tags) + str(k): rng.choice([rng.uniform(-1e6, 1e6), rng.choice(specials)])
                  for k in range(rng.choice([1, 3, 20]))}
        step = rng.choice([0, 1, 127, 128, 64 * i, 2**40])
        wall_time = rng.choice([1795965176.123456, 1.0, 0.5])
        expected = Event(wall_time=wall_time, step=step, summary=Summary(value=[
            Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])).SerializeToString()
        assert scalar_event(values, step, wall_time) == expected, (values, step)


def test_scalars_written_later_read_back_as_tensorboards_own_in_the_order_of_the_calls(tmp_path):
    """RunLogger: the per-game scalars and records gathered (`scalars_later`, `record_later`) and written with the next
    immediate write read back (EventAccumulator, metrics.jsonl) as SummaryWriter.add_scalar's and one line per record,
    in the order of the calls, on both of write_events' paths (the file kept open, TensorBoard's own queue)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from continual.training import tracking
    from continual.training.tracking import RunLogger, read_metrics

    def calls(log):
        for i in range(1500):  # past PENDING_LINES: some gathered events are written before an immediate write
            log("later", {"charts/episodic_return": (-1) ** i * i / 3, "charts/episodic_length": i % 17}, 64 * (i // 3))
            if i % 200 == 199:
                log("now", {"charts/SPS": 1000 + i, "losses/value_loss": 1 / (i + 1)}, 64 * (i // 3))
            if i == 700:
                log("text", {}, 64 * (i // 3))

    reference = SummaryWriter(str(tmp_path / "reference"))
    calls(lambda how, values, step: [reference.add_scalar(tag, v, step) for tag, v in values.items()]
          if how != "text" else reference.add_text("charts/modification", "x", step))
    reference.close()
    for kept in (True, False):
        folder = tmp_path / str(kept)
        folder.mkdir()
        if not kept:  # TensorBoard's own path (a GFile, other internals): the events go through its queue
            original, tracking.keep_event_file_open = tracking.keep_event_file_open, lambda writer: None
        logger = RunLogger(str(folder), {"a": 1})
        if not kept:
            tracking.keep_event_file_open = original
        expected = []

        def log(how, values, step):
            if how == "later":
                logger.scalars_later(values, step)
                logger.record_later("episode", step, **values)
            elif how == "now":
                logger.scalars(values, step)
                logger.record("iteration", step, **values)
            else:
                logger.text("charts/modification", "x", step)
                return
            expected.append({"kind": "episode" if how == "later" else "iteration", "global_step": step, **values})

        calls(log)
        logger.flush()
        assert [{k: v for k, v in r.items() if k != "time"} for r in read_metrics(str(folder / "metrics.jsonl"))] \
            == expected
        logger.close()
        accs = [EventAccumulator(str(f)) for f in (tmp_path / "reference", folder)]
        for acc in accs:
            acc.Reload()
        assert accs[1].Tags()["scalars"] == accs[0].Tags()["scalars"]
        for tag in accs[0].Tags()["scalars"]:
            assert [(e.step, e.value) for e in accs[1].Scalars(tag)] == [(e.step, e.value) for e in accs[0].Scalars(tag)]
        assert [e.step for e in accs[1].Tensors("charts/modification/text_summary")] == [64 * 233]
