"""Run directory and logging: resolved config, TensorBoard, a JSONL metrics file, and optional W&B.

Run directory layout (`runs/<run_name>/`):
  config.json        the resolved configuration (Args + curriculum), written before training starts
  metrics.jsonl      one JSON object per line: {"kind": "iteration"|"episode"|"switch", "global_step": ..., ...}
  events.out.tfevents.*   TensorBoard (CleanRL tags + episodic_return_by_modif/<regime>, charts/regime)
  checkpoints/       *.cleanrl_model
  videos/            <regime>__step<N>-episode-<k>.mp4 (with --capture_video)
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
import sys
import time
from typing import Any, Callable, Optional, Sequence

from continual.errors import FULL_DISK_ERRNOS, StorageError, UserError, one_line
from continual.io import AppendFile, atomic_write_json, atomic_write_text, read_jsonl, read_jsonl_lines, storage_errors
from continual.training.checkpoint import checkpoint_dir


def check_writable(folder: str) -> None:
    """Fail at start, not at the first checkpoint, when the output folder cannot be written."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as e:
        if e.errno in FULL_DISK_ERRNOS:  # not bad input: the run can go on once space is back (exit 1)
            raise StorageError(folder, e) from None
        raise UserError(f"output folder {folder!r} is not writable: {e.strerror or e}") from None


def create_run_dir(runs_dir: str, run_name: str) -> str:
    check_writable(runs_dir)
    path = os.path.join(runs_dir, run_name)
    if os.path.exists(path):
        raise UserError(f"run directory {path!r} already exists; pass --resume {path} to continue it, or another "
                        f"--run_name")
    os.makedirs(checkpoint_dir(path))
    return path


def write_json(path: str, data: Any) -> None:
    with storage_errors(path):
        atomic_write_json(path, data, sort_keys=True)


class _KeptOpenEventFile:
    """The event file kept open, appends buffered, in place of TensorBoard's GFile (`keep_event_file_open`)."""

    def __init__(self, gfile: Any):
        self._gfile = gfile
        self._file = open(gfile.filename, "ab")  # after the GFile's first write: it created and truncated the file

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._gfile.close()


def keep_event_file_open(writer: Any) -> None:
    """Without TensorFlow, TensorBoard's GFile opens, appends to and closes the event file for every record: a file
    object and three system calls per scalar on TensorBoard's writer thread, which shares the GIL with training (for
    PPO on MinAtar, whose games end ~500 times per 8,192 steps, the per-game scalars cost more CPU than the games).
    `writer`'s record writer gets the same file kept open instead: the same bytes, reaching the disk when TensorBoard
    flushes (its flush_secs, `flush()`, `close()`; `RunLogger.flush` before every checkpoint) or 8 KB have gathered.
    Nothing is changed where TensorBoard's internals are not the ones this was written for (other file systems, other
    versions)."""
    events = getattr(writer._get_file_writer(), "event_writer", None)
    gfile = getattr(events, "_general_file_writer", None)
    records = getattr(getattr(events, "_async_writer", None), "_writer", None)
    if (gfile is None or getattr(records, "_writer", None) is not gfile or "://" in str(getattr(gfile, "filename", ""))
            or not getattr(gfile, "fs_supports_append", False) or not getattr(gfile, "write_started", False)):
        return
    events.flush()  # the records queued so far go through the GFile
    records._writer = _KeptOpenEventFile(gfile)


class WarnOnce:
    """`target` (a TensorBoard writer, a W&B run) whose method calls never stop the run: the first failure prints one
    warning line, and every later call does nothing (a failed TensorBoard writer's thread is dead: closing it could
    block)."""

    def __init__(self, target: Any, what: str):
        self._target, self._what, self._failed = target, what, False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr
        return functools.partial(self.call, attr)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` under the same rule (a function of the target's that is not one of its methods)."""
        if self._failed:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self._failed = True
            print(f"warning: {self._what} write failed ({one_line(str(e) or type(e).__name__)[:200]}); the run "
                  f"goes on without {self._what}", file=sys.stderr)
            return None


def scalar_event(values: dict[str, float], global_step: int, wall_time: Optional[float] = None) -> bytes:
    """The TensorBoard event of `writer.add_scalar(tag, v, global_step)` for every item, as one event holding them
    all, serialized: the same scalars (SummaryWriter's simple values of `float(v)`), read back the same, for a
    fraction of the CPU (TensorBoard without TensorFlow frames and checksums every event in pure Python: for PPO on
    MinAtar the three scalars of every finished game, one event each, cost more CPU than the game). The bytes are
    those of `Event(wall_time, step, summary=Summary(value=[Summary.Value(tag, simple_value)]))`'s
    `SerializeToString()` (tested), written out here: building the protobuf messages cost more than the game."""
    summary = b"".join([_value_head(tag) + _float32(float(v)) for tag, v in values.items()])
    step = int(global_step)
    return b"".join((b"\x09", _DOUBLE(time.time() if wall_time is None else wall_time),  # Event 1: wall_time
                     b"\x10" + _varint(step) if step else b"",  # 2: step (proto3 leaves out a 0)
                     b"\x2a", _varint(len(summary)), summary))  # 5: summary


_DOUBLE, _FLOAT = struct.Struct("<d").pack, struct.Struct("<f").pack


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: a negative number as its two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _value_head(tag: str) -> bytes:
    """Summary 1: a value, up to its float: Summary.Value 1: tag, 2: simple_value (in a oneof: written even at 0)."""
    data = tag.encode()
    field = b"\x0a" + _varint(len(data)) + data if data else b""
    return b"\x0a" + _varint(len(field) + 5) + field + b"\x15"


def _float32(v: float) -> bytes:
    try:
        return _FLOAT(v)  # the float32 protobuf stores: the same rounding (a C cast)
    except OverflowError:  # beyond float32's range: infinite, as the cast gives
        return _FLOAT(math.copysign(math.inf, v))


def write_events(writer: Any, events: list[bytes]) -> None:
    """Serialized events into `writer`'s event file, after those TensorBoard has queued. Where the file is kept open
    (`keep_event_file_open`), they are framed in this thread and written in one go: `add_event` passes each through a
    queue of 20 to TensorBoard's writer thread, a thread wake-up per event."""
    event_writer = writer._get_file_writer().event_writer
    queued = getattr(event_writer, "_async_writer", None)  # TensorBoard's internals: any other shape takes its path
    records = getattr(queued, "_writer", None)
    if not isinstance(getattr(records, "_writer", None), _KeptOpenEventFile):
        from tensorboard.compat.proto.event_pb2 import Event

        for data in events:
            event_writer.add_event(Event.FromString(data))
        return
    with queued._lock:  # no event is queued meanwhile
        queued._check_worker_status()
        queued._byte_queue.join()  # those queued before are written
        records._writer.write(tf_records(events))


def tf_records(events: list[bytes]) -> bytes:
    """The events framed as TensorBoard's RecordWriter frames each (length, its masked CRC-32C, the data, the data's
    masked CRC-32C): the same bytes. Without TensorFlow, TensorBoard checksums byte by byte in Python (~0.2 us a
    byte, ~25 us per game's event); here the checksums of all events advance together, one numpy step per byte
    position."""
    lengths = [struct.pack("<Q", len(data)) for data in events]
    length_crcs, data_crcs = masked_crc32c(lengths), masked_crc32c(events)
    return b"".join(b"".join((n, struct.pack("<I", nc), data, struct.pack("<I", dc)))
                    for n, nc, data, dc in zip(lengths, length_crcs.tolist(), events, data_crcs.tolist()))


def masked_crc32c(chunks: list[bytes]) -> Any:
    """TensorBoard's `masked_crc32c` of every chunk (a uint32 array): its table-driven CRC-32C, the chunks side by side
    (longest first, so the chunks still being read are a prefix), the last few long ones finished byte by byte."""
    import numpy as np
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import CRC_TABLE

    table = np.array(CRC_TABLE, dtype=np.uint32)
    order = sorted(range(len(chunks)), key=lambda i: -len(chunks[i]))
    sizes = [len(chunks[i]) for i in order]
    width = sizes[0] if sizes else 0
    grid = np.zeros((len(chunks), width), dtype=np.uint8)  # row k: chunk order[k], zero-padded
    grid[np.arange(width) < np.array(sizes)[:, None]] = np.frombuffer(b"".join(chunks[i] for i in order), np.uint8)
    columns = np.ascontiguousarray(grid.T)  # byte position j of every chunk: columns[j]
    crc = np.full(len(chunks), 0xFFFFFFFF, dtype=np.uint32)
    active = len(chunks)
    for j in range(width):
        while active and sizes[active - 1] <= j:
            active -= 1
        if active <= 4:  # a few long chunks left (an iteration's ~20 scalars): numpy's per-call cost would dominate
            for k in range(active):
                c = int(crc[k])
                for b in grid[k, j:sizes[k]].tobytes():
                    c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
                crc[k] = c
            break
        head = crc[:active]
        crc[:active] = table[(head ^ columns[j, :active]) & 0xFF] ^ (head >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)  # uint32: wraps mod 2**32
    out = np.empty_like(masked)
    out[order] = masked
    return out


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class RunLogger:
    """Writes the same scalars to TensorBoard, metrics.jsonl and (with --track) W&B."""

    PENDING_LINES = 1024  # record_later's lines (scalars_later's events) gathered at most

    def __init__(self, run_dir: str, config: dict, *, track: bool = False, wandb_project: str = "",
                 wandb_entity: Optional[str] = None, wandb_dir: Optional[str] = None, run_name: str = "",
                 resume_step: Optional[int] = None, wandb_id: Optional[str] = None,
                 resume_modification: Optional[str] = None, wandb_group: Optional[str] = None,
                 wandb_tags: Sequence[str] = ()):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
        if resume_step is not None:
            truncate_metrics(self.metrics_path, resume_step, resume_modification)
        # purge_step hides TensorBoard events past the checkpoint, so a resumed run has no duplicated steps
        writer = SummaryWriter(run_dir, purge_step=None if resume_step is None else resume_step + 1)
        keep_event_file_open(writer)
        self.writer = WarnOnce(writer, "TensorBoard")
        self._metrics = AppendFile(self.metrics_path)
        self._pending: list[str] = []  # record_later's lines
        self._pending_events: list[bytes] = []  # scalars_later's TensorBoard events, serialized
        if resume_step is None:
            self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
                f"|{k}|{v}|" for k, v in sorted(config.items()) if not isinstance(v, dict)))
        self.wandb_run = None
        if track:
            import wandb

            self.wandb_run = wandb.init(
                project=wandb_project, entity=wandb_entity, name=run_name, config=config,
                dir=wandb_dir or run_dir, id=wandb_id, resume="allow", job_type="training", group=wandb_group,
                tags=list(wandb_tags) or None,
            )
            self.wandb_run = WarnOnce(self.wandb_run, "W&B")
            self.wandb_run.define_metric("global_step")
            self.wandb_run.define_metric("*", step_metric="global_step")
        self._logged_videos: set[str] = set()

    @property
    def wandb_id(self) -> Optional[str]:
        return self.wandb_run.id if self.wandb_run is not None else None

    def record(self, kind: str, global_step: int, **fields: Any) -> None:
        """A line of metrics.jsonl, written now, after those `record_later` gathered (one write for them all)."""
        self.record_later(kind, global_step, **fields)
        self._write_pending()

    def record_later(self, kind: str, global_step: int, **fields: Any) -> None:
        """`record`'s line, written with the next `record` (the iteration's), `flush` or `close`, or once
        `PENDING_LINES` have gathered: in the same order, with the time of this call. For the per-game records, one
        write per iteration instead of one system call per game; a killed run loses only lines past its last
        checkpoint, which a resumed run drops and writes again anyway."""
        self._pending.append(json.dumps({"kind": kind, "global_step": int(global_step), "time": round(time.time(), 3),
                                         **{k: _clean(v) for k, v in fields.items()}}) + "\n")
        if len(self._pending) >= self.PENDING_LINES:
            self._write_pending()

    def _write_pending(self) -> None:
        if self._pending:
            text, self._pending = "".join(self._pending), []
            self._metrics.write(text)

    def scalars(self, values: dict[str, float], global_step: int) -> None:
        self.scalars_later(values, global_step)
        self._write_pending_events()

    def scalars_later(self, values: dict[str, float], global_step: int) -> None:
        """`scalars`, whose TensorBoard event (with the time of this call) is written with the next `scalars`, `text`,
        `flush` or `close`, or once `PENDING_LINES` have gathered: the per-game scalars in one write per iteration."""
        if values:
            self._pending_events.append(scalar_event(values, global_step))
            if len(self._pending_events) >= self.PENDING_LINES:
                self._write_pending_events()
        if self.wandb_run is not None:
            self.wandb_run.log({**values, "global_step": global_step})

    def _write_pending_events(self) -> None:
        if self._pending_events:
            events, self._pending_events = self._pending_events, []
            self.writer.call(write_events, self.writer._target, events)

    def summary(self, values: dict[str, Any]) -> None:
        """Values for the W&B run summary (the final metrics: what the project's run table shows)."""
        if self.wandb_run is not None:
            self.wandb_run.summary.update({k: v for k, v in values.items() if v is not None})

    def text(self, tag: str, value: str, global_step: int) -> None:
        self._write_pending_events()
        self.writer.add_text(tag, value, global_step)

    def log_new_videos(self, video_dir: str, global_step: int) -> None:
        """Send finished videos to W&B (videos are files on disk either way)."""
        if self.wandb_run is None or not os.path.isdir(video_dir):
            return
        import wandb

        for name in sorted(os.listdir(video_dir)):
            if name.endswith(".mp4") and name not in self._logged_videos:
                self._logged_videos.add(name)
                regime = name.split("__step")[0]
                self.wandb_run.log({f"videos/{regime}": wandb.Video(os.path.join(video_dir, name), format="mp4"),
                                    "global_step": global_step})

    def log_artifact(self, path: str, name: str, metadata: dict) -> None:
        if self.wandb_run is None:
            return
        import wandb

        artifact = wandb.Artifact(name=name, type="model", metadata=metadata)
        artifact.add_file(path)
        self.wandb_run.log_artifact(artifact)

    def flush(self) -> None:
        """The pending records to disk (a checkpoint's: a resumed run purges TensorBoard's steps past it)."""
        self._write_pending()
        self._write_pending_events()
        self.writer.flush()

    def close(self) -> None:
        self._write_pending_events()
        self.writer.close()
        try:
            self._write_pending()
        finally:
            self._metrics.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def truncate_metrics(path: str, step: int, modification: Optional[str] = None) -> None:
    """Drop records written after the checkpoint we resume from (they will be produced again). A switch record at the
    checkpoint's own step stays when the checkpoint already holds the new regime (it will not be switched again)."""
    if not os.path.exists(path):
        return
    keep = []
    for line, rec in read_jsonl_lines(path):  # a last line cut by a crash is dropped
        redo_switch = rec.get("kind") == "switch" and rec["global_step"] == step and rec.get("modification") != modification
        if rec.get("global_step", 0) <= step and not redo_switch:
            keep.append(line if line.endswith("\n") else line + "\n")
    with storage_errors(path):
        atomic_write_text(path, "".join(keep))


def read_metrics(path: str) -> list[dict]:
    """The records of metrics.jsonl (continual.io.read_jsonl: a last line cut by a crash is dropped)."""
    return read_jsonl(path)
