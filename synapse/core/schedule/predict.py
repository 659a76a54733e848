"""Run times predicted from the cluster's own finished runs. Pure, and part of the replicated state.

Most jobs recur: the same user submits the same script at the same size again and again (Alibaba
PAI tags such jobs as groups; its shortest-job-first with an estimator keyed on group, user and GPUs
came within 0.2 % of the oracle's mean JCT). Time limits are what users ask for, mostly far above
the run, so a scheduler that plans by them plans for jobs that never last that long.

The rule is EASY++'s (Tsafrir, Etsion and Feitelson, TPDS 2007), keyed as PAI's and Helios's
estimators are:

* a job is predicted to run the mean of the last two runs of its key (user, job name, GPUs of the
  gang); without one, of its user's last two runs; without those, or for a job of no known user
  (a cluster without users: nothing says two jobs are the same one's), its time limit (none:
  unknown);
* never beyond its time limit: the limit stays the kill time, and what a reservation is promised
  is bounded by it (see synapse.core.schedule.scheduler);
* a job that outlives its prediction is predicted to end at the next step of `STEPS` after the
  time it has run (Tsafrir's correction), again never beyond its limit.

What is learned is what ran: an attempt that ended on its own (its tasks exited, or its time limit
ended it). Preempted, cancelled, resized and node-lost attempts say nothing about the run.

Memory: one entry per key, each the run count and the last `KEEP` runs, so it grows with users x
job names x sizes (plus one per user), up to `MAX_KEYS` entries (the least recently learned key is
dropped first), whatever the number of runs: about 450 bytes an entry with its key's strings
(tracemalloc, 61,000 keys of 1,000 users x 60 names: 27 MB), about 22 MB at the cap.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

#: Runs kept per key; EASY++ predicts from the last two.
KEEP = 2
#: Keys kept at most; the least recently learned is forgotten first.
MAX_KEYS = 50_000
#: Tsafrir's steps for a job that outlives its prediction, seconds: 1, 5, 15, 30 min, 1, 2, 5, 10,
#: 20, 50, 100 h.
STEPS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 18_000.0, 36_000.0, 72_000.0, 180_000.0, 360_000.0)


@dataclass(frozen=True, slots=True)
class Prediction:
    """How long a job is expected to run in all, and what that rests on."""

    seconds: float  #: inf when nothing is known (no runs, no time limit)
    basis: str  #: "job": its (user, name, gpus) runs; "user": its user's runs; "limit"; "none"
    runs: int = 0  #: runs of the key it rests on (all seen, not only those kept)
    extended: bool = False  #: the job outlived the learned guess, which was raised (EASY++)
    longest: float = math.inf  #: the longest of the runs kept (at most the limit; inf without runs)

    def describe(self, user: str, name: str, gpus: int) -> str:
        """`predicted 42m from 5 runs of (alice, train-llm, 64 GPU)`, for people."""
        if self.basis == "none":
            return "no prediction: no runs of its kind and no time limit"
        head = f"predicted {_duration(self.seconds)}"
        if self.basis == "limit":
            return f"{head}: its time limit (no runs of ({user}, {name}, {gpus} GPU) or of {user} yet)"
        what = f"({user}, {name}, {gpus} GPU)" if self.basis == "job" else f"user {user} (any job)"
        tail = ", raised: it has run longer than the runs predicted" if self.extended else ""
        return f"{head} from {self.runs} run(s) of {what}{tail}"


def _raised(elapsed: float, cap: float) -> float:
    """What a job that has run `elapsed`, past its prediction, is predicted to run in all: the next
    of `STEPS` (twice what it has run beyond the last), never beyond `cap`."""
    for step in STEPS:
        if step > elapsed:
            return min(cap, step)
    return min(cap, 2 * elapsed)


def _longest(runs: list[float], limit: float, elapsed: float) -> float:
    """The longest of `runs`, never beyond `limit` (0: none), raised as a prediction is if the job
    has run longer than their mean already."""
    cap = limit if limit > 0 else math.inf
    guess: float = min(cap, sum(runs) / len(runs))
    longest: float = min(cap, max(runs))
    return max(longest, guess if elapsed < guess else _raised(elapsed, cap))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


class RunTimes:
    """The learned runs, per key, in the order they were last learned (oldest first).

    Changed only by `learn`, which the state machine's apply calls with the attempt's own times,
    so every replica learns the same and a new leader predicts as the old one did."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        #: key -> [runs seen, the last KEEP runs, oldest first]; least recently learned first
        self.keys: OrderedDict[tuple[Any, ...], list[Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.keys)

    def learn(self, user: str, name: str, gpus: int, seconds: float) -> None:
        """Record one run of `seconds` of (user, name, gpus), and of the user (none without a user)."""
        if not user or not math.isfinite(seconds) or seconds < 0:
            return
        for key in (("job", user, name, gpus), ("user", user)):
            entry = self.keys.get(key)
            if entry is None:
                entry = self.keys[key] = [0, []]
            else:
                self.keys.move_to_end(key)
            entry[0] += 1
            entry[1].append(float(seconds))
            del entry[1][:-KEEP]
        while len(self.keys) > self.max_keys:
            self.keys.popitem(last=False)

    def expect(self, user: str, name: str, gpus: int, limit: float, elapsed: float = 0.0,
               own_kind: bool = False) -> float:
        """`predict(...).seconds`, without the rest: what a scheduling round asks for every job it
        weighs, so it builds nothing. `own_kind`: from runs of (user, name, gpus) only, never the
        user's other jobs (else the limit)."""
        if user:
            entry = self.keys.get(("job", user, name, gpus)) or (None if own_kind else self.keys.get(("user", user)))
            if entry is not None:
                runs = entry[1]
                guess: float = sum(runs) / len(runs)
                cap = limit if limit > 0 else math.inf
                return min(cap, guess) if elapsed < min(cap, guess) else _raised(elapsed, cap)
        return limit if limit > 0 else math.inf

    def knows(self, user: str, name: str, gpus: int) -> bool:
        """Whether `expect` (not `own_kind`) rests on runs, of the job's kind or its user, rather
        than on the time limit alone."""
        return bool(user) and (("job", user, name, gpus) in self.keys or ("user", user) in self.keys)

    def longest_own(self, user: str, name: str, gpus: int, limit: float, elapsed: float = 0.0) -> float | None:
        """`predict(...).longest` when the prediction rests on runs of (user, name, gpus) itself;
        None when it does not. What a scheduling round asks for every job that might go on reserved
        nodes (reservations.backfill_run), so, like `expect`, it builds nothing."""
        entry = self.keys.get(("job", user, name, gpus)) if user else None
        return None if entry is None else _longest(entry[1], limit, elapsed)

    def longest_user(self, user: str, limit: float, elapsed: float = 0.0) -> float | None:
        """As `longest_own`, from the user's last runs of any job; None without them."""
        entry = self.keys.get(("user", user)) if user else None
        return None if entry is None else _longest(entry[1], limit, elapsed)

    def predict(self, user: str, name: str, gpus: int, limit: float, elapsed: float = 0.0) -> Prediction:
        """The run expected of a job of (user, name, gpus) with time `limit` (0: none) that has
        run `elapsed` seconds so far. Reads only."""
        cap = limit if limit > 0 else math.inf
        for basis, key in (("job", ("job", user, name, gpus)), ("user", ("user", user))) if user else ():
            entry = self.keys.get(key)
            if entry is not None:
                guess = min(cap, sum(entry[1]) / len(entry[1]))
                longest = min(cap, max(entry[1]))
                if elapsed < guess:
                    return Prediction(guess, basis, entry[0], longest=max(longest, guess))
                raised = _raised(elapsed, cap)
                return Prediction(raised, basis, entry[0], extended=True, longest=max(longest, raised))
        return Prediction(cap, "limit" if limit > 0 else "none")

    def to_list(self) -> list[list[Any]]:
        """Plain data, least recently learned first (the order is part of the state: it decides
        which key goes first at the cap)."""
        return [[*key, count, list(runs)] for key, (count, runs) in self.keys.items()]

    @classmethod
    def from_list(cls, rows: list[list[Any]], max_keys: int = MAX_KEYS) -> RunTimes:
        out = cls(max_keys)
        for row in rows:
            *key, count, runs = row
            out.keys[tuple(key)] = [int(count), [float(r) for r in runs]]
        return out
