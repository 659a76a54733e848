"""What a leader spends per submission, step by step, on the pure code (no sockets, no Raft).

    python bench/submit_steps.py [--submits 3000] [--batch 8] [--repeat 5] [--json]

bench/ha.py measures the leader's CPU per submission as a whole; this splits the work it does in
Python into the steps of one submission, timed in this process, so a change to one step shows
its own cost: the request's decode, the spec's decode and validation, the proposal's encode
(command, group-commit batch, checksum), the apply of the entry on a replica (checksum, decode,
state machine), the scheduling round a batch of submissions triggers (and the PendingReasons
entry it proposes, applied), and the log line. The state starts with `--submits` jobs pending
and no nodes, as bench/ha.py's cluster does in its middle, with logging and the collector set as
in a master.
Not measured here: gRPC's own work per call (bench/grpc_floor.py), the Raft transport, the
journal's fsync. Times are this process's CPU
time (not wall time, which other work on a shared machine stretches), each step's best of
`--repeat` runs.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.common.collector import tune_for_large_state  # noqa: E402
from synapse.common.logs import configure  # noqa: E402
from synapse.core import codec  # noqa: E402
from synapse.core import commands as c  # noqa: E402
from synapse.core.brain.leader_state import LeaderState  # noqa: E402
from synapse.core.brain.stimuli import Propose, RoundDue  # noqa: E402
from synapse.core.jobs.jobspec import check_spec  # noqa: E402
from synapse.core.model import JobSpec, Resources  # noqa: E402
from synapse.core.state.fsm import ClusterState  # noqa: E402
from synapse.master.durability import seal, unseal  # noqa: E402
from synapse.proto import api_pb2  # noqa: E402

SPEC = JobSpec(name="bench", tasks=8, resources=Resources(16_000, 64 << 30, 8), command=("python", "train.py"))


def submissions(prefix: str, n: int, at: float) -> list[c.SubmitJob]:
    return [c.SubmitJob(at=at, by="admin", job_id=f"{prefix}-{i}", request_id=f"{prefix}-{i}", spec=SPEC)
            for i in range(n)]


def measure(submits: int, batch: int) -> dict[str, float]:
    """Microseconds per submission of each step."""
    state, brain = ClusterState(), LeaderState()
    for cmd in submissions("pre", submits, 1.0):  # the queue bench/ha.py's leader holds midway
        state.apply(cmd)
    out = brain.handle(state, RoundDue(at=1.0, full=True))
    while out:  # record the queue's pending reasons, as the leader's first rounds do
        for instruction in out:
            if isinstance(instruction, Propose):
                state.apply(instruction.cmd)
        out = brain.handle(state, RoundDue(at=1.0, full=False))
    request = api_pb2.SubmitJobRequest(request_id="r-1", spec=codec.job_spec_to_proto(SPEC)).SerializeToString()
    logger = logging.getLogger("bench.submit_steps")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s x %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    spent = dict.fromkeys(("request decode", "spec decode + validation", "proposal encode", "apply",
                           "scheduling round (+ its PendingReasons applied)", "log line"), 0.0)
    done = 0
    while done < submits:
        cmds = submissions(f"b{done}", batch, 2.0 + done)
        t0 = time.process_time()
        for _ in cmds:
            parsed = api_pb2.SubmitJobRequest.FromString(request)
        t1 = time.process_time()
        for _ in cmds:
            check_spec(codec.job_spec_from_proto(parsed.spec))
        t2 = time.process_time()
        entry = seal(codec.encode_batch(cmds))
        t3 = time.process_time()
        state.apply_entry(unseal(entry))
        t4 = time.process_time()
        for instruction in brain.handle(state, RoundDue(at=2.0 + done, full=False)):
            if isinstance(instruction, Propose):
                state.apply_entry(unseal(seal(codec.encode_command(instruction.cmd))))
        t5 = time.process_time()
        for cmd in cmds:
            logger.info("job submitted job=%s request=%s tasks=%d user=%s", cmd.job_id, cmd.request_id,
                        cmd.spec.tasks, cmd.by)
        t6 = time.process_time()
        for key, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
            spent[key] += seconds
        done += batch
    return {k: round(v * 1e6 / done, 1) for k, v in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=8, help="submissions per group-commit entry and round")
    parser.add_argument("--repeat", type=int, default=5, help="runs; each step's best run is shown (a shared machine)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a second, same code path: 200 submissions")
    args = parser.parse_args()
    configure("bench")  # logging and the collector set as in a master
    tune_for_large_state()
    if args.quick:
        args.submits, args.repeat = 200, 1
    runs = [measure(args.submits, args.batch) for _ in range(args.repeat)]
    steps = {step: min(run[step] for run in runs) for step in runs[0]}
    if args.json:
        print(json.dumps(steps))
        return
    for step, us in steps.items():
        print(f"{step:<50} {us:8.1f} us per submission")
    print(f"{'all of these':<50} {sum(steps.values()):8.1f} us per submission")


if __name__ == "__main__":
    main()
