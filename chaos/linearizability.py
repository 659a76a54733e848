"""A linearizability checker: Wing & Gong's search with Lowe's memoisation, as Porcupine and Knossos do.

Generic over a sequential model (`Model`: an initial state and a step function), and partitioned
by key when the model allows it (independent keys are checked separately, which turns one
exponential search into many small ones).

An operation is `Op(id, f, key, input, output, invoke, complete, status)`:
* status "ok": it took effect exactly once, somewhere between invoke and complete, and returned
  `output`;
* status "fail": it certainly did not take effect; it is left out;
* status "unknown" (a timeout, a lost reply): it may have taken effect at any time after `invoke`,
  or never. It is given a completion time of +inf and an unconstrained output, and the search may
  place it after every other operation, which is the same as its never having happened.

`check(model, ops, budget_s)` answers "ok", "violation" (no order explains the history) or
"unknown" (the time budget ran out: never a guess).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Op:
    id: int
    f: str
    key: Hashable
    input: Any
    output: Any
    invoke: float
    complete: float | None  #: None for status "unknown"
    status: str = "ok"  #: ok | fail | unknown


@dataclass(frozen=True, slots=True)
class Model:
    """A sequential specification. `step(state, op)` returns (legal, next state); states must be hashable.
    For an op with status "unknown" the output is unconstrained: step must not check it."""

    init: Callable[[], Hashable]
    step: Callable[[Hashable, Op], tuple[bool, Hashable]]
    partition: Callable[[list[Op]], list[list[Op]]] = field(default=lambda ops: [ops])


@dataclass(slots=True)
class _Entry:
    op: Op
    is_call: bool
    time: float
    match: _Entry | None = None
    prev: _Entry | None = None
    next: _Entry | None = None


def _lift(entry: _Entry) -> None:
    """Take a call and its return out of the list."""
    for e in (entry, entry.match):
        assert e is not None
        e.prev.next = e.next  # type: ignore[union-attr]
        if e.next is not None:
            e.next.prev = e.prev


def _unlift(entry: _Entry) -> None:
    for e in (entry.match, entry):
        assert e is not None
        e.prev.next = e  # type: ignore[union-attr]
        if e.next is not None:
            e.next.prev = e


def _backtrack(stack: list[tuple[_Entry, Hashable]], index: dict[int, int],
               linearized: int) -> tuple[_Entry | None, Hashable, int]:
    """Undo the most recent linearization; the search resumes at the entry after it."""
    entry, state = stack.pop()
    _unlift(entry)
    return entry.next, state, linearized & ~(1 << index[entry.op.id])


def _check_partition(model: Model, ops: list[Op], deadline: float) -> str:
    ops = [op for op in ops if op.status != "fail"]
    if not ops:
        return "ok"
    entries: list[_Entry] = []
    for op in ops:
        call = _Entry(op, True, op.invoke)
        ret = _Entry(op, False, math.inf if op.status == "unknown" or op.complete is None else op.complete)
        call.match, ret.match = ret, call
        entries += [call, ret]
    # Returns sort before calls at the same instant: touching operations do not overlap.
    entries.sort(key=lambda e: (e.time, e.is_call))
    head = _Entry(ops[0], True, -math.inf)
    prev = head
    for e in entries:
        prev.next, e.prev = e, prev
        prev = e
    index = {op.id: i for i, op in enumerate(ops)}
    state = model.init()
    linearized = 0
    cache: set[tuple[int, Hashable]] = set()
    stack: list[tuple[_Entry, Hashable]] = []
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if steps % 1024 == 0 and time.monotonic() > deadline:
            return "unknown"
        assert entry is not None
        if entry.is_call:
            legal, new_state = model.step(state, entry.op)
            if legal:
                bit = 1 << index[entry.op.id]
                key = (linearized | bit, new_state)
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state))
                    state, linearized = new_state, linearized | bit
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:  # a return whose call is not linearized yet: undo the last choice
            if not stack:
                return "violation"
            entry, state, linearized = _backtrack(stack, index, linearized)
        while entry is None:  # ran off the end: only unknown operations are left; undo again
            if not stack:
                return "violation"
            entry, state, linearized = _backtrack(stack, index, linearized)
    return "ok"


def check(model: Model, ops: list[Op], budget_s: float = 10.0) -> str:
    """'ok', 'violation' or 'unknown' (budget exhausted) for a whole history."""
    deadline = time.monotonic() + budget_s
    verdict = "ok"
    for part in model.partition(ops):
        result = _check_partition(model, part, deadline)
        if result == "violation":
            return "violation"
        if result == "unknown":
            verdict = "unknown"
    return verdict


def by_key(ops: list[Op]) -> list[list[Op]]:
    parts: dict[Hashable, list[Op]] = {}
    for op in ops:
        parts.setdefault(op.key, []).append(op)
    return list(parts.values())


# ---- models ----------------------------------------------------------------------------------

def _register_step(state: Hashable, op: Op) -> tuple[bool, Hashable]:
    unknown = op.status == "unknown"
    if op.f == "read":
        return (unknown or op.output == state), state
    if op.f == "write":
        return True, op.input
    if op.f == "cas":
        expected, new = op.input
        if state == expected:
            return (unknown or op.output is True), new
        return (unknown or op.output is False), state
    raise ValueError(f"register: unknown operation {op.f}")


#: A register per key: read / write / compare-and-set, initially None.
REGISTER = Model(init=lambda: None, step=_register_step, partition=by_key)


def _job_step(state: Hashable, op: Op) -> tuple[bool, Hashable]:
    """Per client request id: state None (no job) or the job id it created.

    submit(key=request id) -> output job id: creates the job once; a retry returns the same id.
    get(key=request id, input=job id) -> output True (found) / False (not found).
    """
    unknown = op.status == "unknown"
    if op.f == "submit":
        if state is None:
            return True, (op.output if not unknown else "?")
        return (unknown or state == "?" or op.output == state), state if state != "?" else op.output
    if op.f == "get":
        exists = state is not None
        return (unknown or op.output == exists), state
    raise ValueError(f"job model: unknown operation {op.f}")


#: Job submissions by request id (idempotent) and reads of them: partitioned by request id.
JOBS = Model(init=lambda: None, step=_job_step, partition=by_key)
