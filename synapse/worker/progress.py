"""A task's progress file: what the task says of its progress, read cheaply and forwarded.

Every task gets `SYNAPSE_PROGRESS_FILE`, a path in the worker's task directory. A task that wants
its goodput measured writes a line there whenever it has news (appending or rewriting, as it likes):

    step=1234
    step=1250 checkpoint=1735689600
    {"step": 1300, "checkpoint": 1300}

`step` is the latest training step (a whole number >= 0). `checkpoint` is the last checkpoint that
is safely written: a Unix time (seconds since the epoch, 1e9 or more), or the step it saved
(smaller numbers; the checkpoint's time is then when the worker saw it). Pairs are separated by
spaces or commas; a line may be a JSON object with the same keys. The last complete line (ending in a
newline) wins; a line without either key, or with a bad value, is garbage: ignored, said once per
task in the worker's log and as a `ProgressIgnored` job event, and never fatal.

The worker looks at the files of its running tasks at most every POLL_S, by their size and mtime
(nothing is read while they do not change), and forwards a changed checkpoint at once and a changed
step at most every STEP_EVERY_S, on its task-report path (synapse.worker.agent).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from synapse.proto import api_pb2

log = logging.getLogger(__name__)

#: How often the worker looks at its tasks' progress files (a stat each).
POLL_S = 1.0
#: A changed step alone is forwarded at most this often per task (a checkpoint goes at once).
STEP_EVERY_S = 10.0
#: Only the file's tail is read: the last complete line is in it.
TAIL_BYTES = 4096
#: A `checkpoint` value at least this large is a Unix time; below it, a step.
UNIX_TIME_FLOOR = 1e9

Key = tuple[str, int, int]


#: Where a task in an image finds its progress file: the host directory that holds it is bound
#: there (a directory, not the file, so a task may also replace the file by a rename).
CONTAINED_PROGRESS_DIR = "/run/synapse"


def progress_file(exit_file: Path) -> Path:
    """The progress file of the task whose exit file (synapse.worker.runtime) is `exit_file`: alone
    in a directory of its own, which a task in an image sees at CONTAINED_PROGRESS_DIR."""
    return exit_file.with_suffix(".progress.d") / "progress"


@dataclass(frozen=True, slots=True)
class Value:
    """One complete line of a progress file, read."""

    step: int = -1  #: -1: not said
    checkpoint: float = -1.0  #: as written: a Unix time (>= UNIX_TIME_FLOOR) or a step; -1: not said


def parse_line(line: str) -> Value | str:
    """A progress line's value, or why it is garbage."""
    text = line.strip()
    if not text:
        return "an empty line"
    fields: dict[str, object]
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except ValueError:
            return f"not JSON: {text[:60]!r}"
        if not isinstance(fields, dict):
            return f"not a JSON object: {text[:60]!r}"
    else:
        fields = {}
        for pair in text.replace(",", " ").split():
            name, sep, value = pair.partition("=")
            if not sep:
                return f"not key=value: {pair[:40]!r}"
            fields[name.strip()] = value.strip()
    step, checkpoint = fields.get("step"), fields.get("checkpoint")
    if step is None and checkpoint is None:
        return f"neither step nor checkpoint in {text[:60]!r}"
    value = Value()
    if step is not None:
        number = _number(step)
        if number is None or number < 0 or number != int(number):
            return f"step must be a whole number >= 0, not {str(step)[:30]!r}"
        value = Value(step=int(number))
    if checkpoint is not None:
        number = _number(checkpoint)
        if number is None or number < 0:
            return f"checkpoint must be a Unix time or a step >= 0, not {str(checkpoint)[:30]!r}"
        value = Value(step=value.step, checkpoint=number)
    return value


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if not isinstance(v, int | float | str):
        return None
    try:
        number = float(v)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_last(path: Path) -> Value | str | None:
    """The value of the file's last complete line, why it is garbage, or None if it has none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    end = tail.rfind(b"\n")
    if end < 0:
        return None  # no complete line yet (or one longer than the tail: the next one will do)
    line = tail[:end].rsplit(b"\n", 1)[-1]
    try:
        return parse_line(line.decode())
    except UnicodeDecodeError:
        return "not text"


@dataclass(slots=True)
class _Seen:
    stamp: tuple[int, int] = (0, -1)  #: (mtime_ns, size) when last read
    step: int = -1
    checkpoint: float = -1.0  #: as written
    checkpoint_at: float = 0.0  #: its time (a step's: when it was first seen)
    checkpoint_step: int = -1
    sent_step: int = -1
    sent_checkpoint_at: float = 0.0
    sent_at: float = -math.inf  #: monotonic
    problem_said: bool = False


class ProgressWatcher:
    """The progress files of a worker's running tasks: `poll` from the main loop, `take` from the
    report thread (the two meet under a lock)."""

    def __init__(self, poll_s: float = POLL_S, step_every_s: float = STEP_EVERY_S) -> None:
        self.poll_s, self.step_every_s = poll_s, step_every_s
        self._seen: dict[Key, _Seen] = {}  #: per running task; poll only
        self._next_poll = -math.inf  #: monotonic; poll only
        self._lock = threading.Lock()
        self._out: dict[Key, api_pb2.TaskEvent] = {}  #: reports to send, the latest per task; under _lock

    def due(self, mono: float) -> bool:
        """True when `poll` would look at the files now (the caller need not list them before)."""
        return mono >= self._next_poll

    def poll(self, files: list[tuple[Key, Path]], mono: float, wall: float) -> bool:
        """Look at the running tasks' files if POLL_S passed; True when there is something to send."""
        if not self.due(mono):
            return False
        self._next_poll = mono + self.poll_s
        ready = False
        keys = {key for key, _ in files}
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]
        for key, path in files:
            seen = self._seen.setdefault(key, _Seen())
            try:
                st = os.stat(path)
            except OSError:
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != seen.stamp:
                seen.stamp = stamp
                ready |= self._read(key, path, seen, st.st_mtime, mono, wall)
            elif seen.step != seen.sent_step:  # a step held back by the rate limit goes when it may
                ready |= self._emit(key, seen, "", mono)
        return ready

    def _read(self, key: Key, path: Path, seen: _Seen, mtime: float, mono: float, wall: float) -> bool:
        value = read_last(path)
        if value is None:
            return False
        problem = ""
        if isinstance(value, str):
            if seen.problem_said:
                return False
            seen.problem_said, problem = True, value
            log.warning("progress file ignored task=%s.%d.%d problem=%s (said once)", *key, value)
        else:
            if value.step >= 0:
                seen.step = value.step
            if value.checkpoint >= 0 and value.checkpoint != seen.checkpoint:
                seen.checkpoint = value.checkpoint
                if value.checkpoint >= UNIX_TIME_FLOOR:
                    seen.checkpoint_at, seen.checkpoint_step = min(value.checkpoint, wall), -1
                else:
                    seen.checkpoint_at, seen.checkpoint_step = min(mtime, wall), int(value.checkpoint)
        return self._emit(key, seen, problem, mono)

    def _emit(self, key: Key, seen: _Seen, problem: str, mono: float) -> bool:
        """Queue a report of the task's value if it is news the rate limit lets through."""
        checkpoint_changed = seen.checkpoint_at != seen.sent_checkpoint_at
        step_due = seen.step != seen.sent_step and mono - seen.sent_at >= self.step_every_s
        if not (problem or checkpoint_changed or step_due):
            return False
        seen.sent_step, seen.sent_checkpoint_at, seen.sent_at = seen.step, seen.checkpoint_at, mono
        event = api_pb2.TaskEvent(job_id=key[0], attempt=key[1], index=key[2], progress=True, step=seen.step,
                                  checkpoint_at=seen.checkpoint_at, checkpoint_step=seen.checkpoint_step,
                                  progress_problem=problem)
        with self._lock:
            old = self._out.get(key)
            if old is not None and old.progress_problem and not problem:
                event.progress_problem = old.progress_problem  # a problem not yet sent is said still
            self._out[key] = event
        return True

    def take(self) -> list[api_pb2.TaskEvent]:
        """The reports to send now (each task's latest), taken."""
        with self._lock:
            out, self._out = list(self._out.values()), {}
        return out

    def put_back(self, events: list[api_pb2.TaskEvent]) -> None:
        """Reports that were not delivered: sent again next time, unless a newer one replaced them."""
        with self._lock:
            for e in events:
                key = (e.job_id, e.attempt, e.index)
                if key not in self._out:
                    self._out[key] = e
                elif e.progress_problem and not self._out[key].progress_problem:
                    self._out[key].progress_problem = e.progress_problem
