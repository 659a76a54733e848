"""The worker's state file (synapse.worker.statefile): what a restarted agent reads back."""

from __future__ import annotations

import dataclasses
import json
import time

from synapse.core.model import Assignment, Resources
from synapse.worker import state as ws
from synapse.worker import statefile
from synapse.worker.runtime import Handle
from synapse.worker.statefile import STATE_FILE


def _assignment(index: int) -> Assignment:
    return Assignment(job_id="j", attempt=1, index=index, rank=index, world_size=2, local_rank=0, local_world_size=1,
                      node_rank=index, master_addr="10.0.0.1", master_port=29500, gpus=(0, 1),
                      command=("python", "train.py"), env=(("A", "1"),), resources=Resources(1000, 1 << 30, 2),
                      mounts=(("/data", "/data", True),), notice_signal="USR1")


def _state() -> ws.WorkerState:
    state = ws.WorkerState(stop_grace=10.0)
    a, b = _assignment(0), _assignment(1)
    state.handle(ws.AssignmentsReceived(2, 7, (a, b)), time.monotonic())
    state.handle(ws.TaskStarted(a.key, Handle(4242, 99, "/t/j.1.0.exit", "/t/j.1.0.log", "cg")), time.monotonic())
    return state


def test_the_file_holds_what_dataclasses_asdict_would_write(tmp_path):
    """The save's shallow field copy writes the same JSON as the recursive asdict it replaced, so an
    older agent reads a newer one's file and back."""
    state = _state()
    statefile.save(tmp_path, state)
    written = json.loads((tmp_path / STATE_FILE).read_text())
    expected = [{"assignment": dataclasses.asdict(t.assignment), "phase": t.phase,
                 "handle": dataclasses.asdict(t.handle) if t.handle else None, "noticed": False}
                for t in state.tasks.values()]
    assert written["tasks"] == json.loads(json.dumps(expected))
    assert written["unreported"] == json.loads(json.dumps(
        [dataclasses.asdict(r) | {"key": list(r.key)} for r in state.unreported]))
    assert not (tmp_path / STATE_FILE).with_suffix(".tmp").exists()


def test_a_saved_state_loads_back(tmp_path):
    state = _state()
    statefile.save(tmp_path, state)
    statefile.save(tmp_path, state)  # over an earlier one
    restored = statefile.load(tmp_path, 10.0, lambda a: None)
    assert restored is not None
    assert restored.known == (2, 7)
    started = _assignment(0)
    assert list(restored.tasks) == [started.key]  # the one without a process is forgotten
    assert restored.tasks[started.key].assignment == started
    assert restored.tasks[started.key].handle == Handle(4242, 99, "/t/j.1.0.exit", "/t/j.1.0.log", "cg")


def test_stopped_between_the_unlink_and_the_rename_the_new_file_is_read(tmp_path):
    """A save writes the new file, unlinks the old one, then renames the new one into place: an
    agent stopped between the two leaves only the new file, whole, and the next one reads it."""
    statefile.save(tmp_path, _state())
    (tmp_path / STATE_FILE).rename((tmp_path / STATE_FILE).with_suffix(".tmp"))
    restored = statefile.load(tmp_path, 10.0, lambda a: None)
    assert restored is not None and restored.known == (2, 7)


def test_a_first_save_cut_short_reads_as_no_state(tmp_path):
    (tmp_path / STATE_FILE).with_suffix(".tmp").write_text('{"boot_id": "x", "kno')
    assert statefile.load(tmp_path, 10.0, lambda a: None) is None
    assert statefile.load(tmp_path / "nothing-here", 10.0, lambda a: None) is None
