"""A step's start inside an allocation, on an idle local TLS cluster (3 masters, 2 workers with 8 fake
GPUs each), and where its time goes.

    python bench/steps.py                 # a table
    python bench/steps.py --json          # the figures below, as one JSON object
    python bench/steps.py --quick         # fewer trials (CI)

An allocation of 2 tasks x 8 GPUs is held; each trial starts a step of one task per allocation task
whose command's first instruction writes the time (`date +%s.%N`). From the step's own record and
its workers' logs:

- step_start: from the StartStep request reaching the leader (the command's `at`, the master's
  clock when it proposes) to the step's first instruction on its last node (the issue's
  `step_start_p50_s`, target <= 0.05 s);
- its phases: request -> reply (Raft commit and apply, the client's reply), request -> the
  worker's spawn logged (`task started`: dispatch, the watch stream, the worker's bookkeeping and
  its process start), spawn -> first instruction (the task's shim and shell);
- step_client_start: from the client's call to the first instruction (adds the RPC and the
  client's own work);
- step_api_end_to_end: from the client's call to `wait_step` seeing the step SUCCEEDED;
- gang_start: the same two tasks submitted as a new gang beside the allocation, from its proposal
  to its first instruction on its last node (a round places it): the same machine's load, compared;
- step_end_to_end: `synctl step -- true` inside the allocation, from exec to exit (Python's and
  gRPC's import time included; the issue's `step_end_to_end_p50_s` for `synctl run`, target <= 0.2 s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.measure import percentile  # noqa: E402

from synapse.client.master_client import MasterClient  # noqa: E402
from synapse.client.steps import start_step, step_spec, wait_step  # noqa: E402
from synapse.core import codec  # noqa: E402
from synapse.core.model import JobSpec, Resources  # noqa: E402
from synapse.local import cluster as local  # noqa: E402

WORKERS = 2


def spawned_at(data_dir: Path, job_id: str) -> list[float]:
    """When each worker logged the step's task started (its process spawned), seconds since the epoch."""
    out = []
    for log in (data_dir / "logs").glob("w*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if f"task started job={job_id} " in line:
                stamp = line.split(" ", 1)[0]  # 2026-12-06T07:10:00.123, the machine's local time
                out.append(datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp())
    return out


def trial(client: MasterClient, data_dir: Path, marks: Path, alloc_id: str, info, i: int) -> dict[str, float]:
    mark = marks / f"t{i}"
    command = ("sh", "-c", f'date +%s.%N > {mark}-"$RANK"')
    spec = step_spec(info, command)
    t0 = time.time()
    step_id = start_step(client, alloc_id, spec)
    replied = time.time()
    ended = wait_step(client, step_id, deadline=time.monotonic() + 30)
    done = time.time()
    if ended.status != "SUCCEEDED":
        raise SystemExit(f"step {step_id} {ended.status}: {ended.failure}")
    first = max(float((marks / f"t{i}-{rank}").read_text()) for rank in range(len(ended.tasks)))
    proposed = ended.submitted_at
    spawned = max(spawned_at(data_dir, step_id), default=float("nan"))
    return {"step_start": first - proposed, "reply": replied - proposed, "spawn": spawned - proposed,
            "shim": first - spawned, "client_start": first - t0, "api_end_to_end": done - t0}


def gang_trial(client: MasterClient, marks: Path, i: int) -> float:
    """The same two tasks as a new gang beside the allocation (queued, placed by a round, no
    allocation): from its SubmitJob's proposal to the first instruction on its last node."""
    mark = marks / f"g{i}"
    spec = JobSpec(name=f"gang{i}", tasks=WORKERS, resources=Resources(250, 0, 0),
                   command=("sh", "-c", f'date +%s.%N > {mark}-"$RANK"'))
    job_id = client.submit_job(codec.job_spec_to_proto(spec)).job_id
    ended = wait_step(client, job_id, deadline=time.monotonic() + 30)
    first = max(float((marks / f"g{i}-{rank}").read_text()) for rank in range(WORKERS))
    return first - ended.submitted_at


def cli_trial(env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "synapse.client.cli", "step", "--", "true"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"synctl step failed: {proc.stderr}")
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="5 trials of each (CI)")
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    trials = 5 if args.quick else args.trials
    with tempfile.TemporaryDirectory(prefix="synapse-bench-steps-") as tmp:
        data_dir, marks = Path(tmp) / "cluster", Path(tmp) / "marks"
        marks.mkdir()
        state = local.up(data_dir, 3, WORKERS, 1, 8, local.free_base_port(3), heartbeat=5.0)
        try:
            client = MasterClient([m["api_address"] for m in state["masters"]], state["token"],
                                  tls=local.client_tls(state))
            spec = JobSpec(name="bench", tasks=WORKERS, resources=Resources(1000, 1 << 30, 8), command=(),
                           alloc=True, idle_timeout=3600.0)
            alloc_id = client.submit_job(codec.job_spec_to_proto(spec)).job_id
            info = wait_step(client, alloc_id, until=frozenset({"RUNNING"}), deadline=time.monotonic() + 60)
            for i in range(2):  # warm-up: connections, the workers' first spawns
                trial(client, data_dir, marks, alloc_id, info, -1 - i)
            runs = [trial(client, data_dir, marks, alloc_id, info, i) for i in range(trials)]
            gangs = [gang_trial(client, marks, i) for i in range(trials)]
            env = {**os.environ, **local.client_env(state), "SYNAPSE_ALLOC": alloc_id}
            cli = [cli_trial(env) for _ in range(max(3, trials // 2))]
        finally:
            local.down(data_dir)
    out: dict[str, float | int] = {"trials": trials}
    for key in ("step_start", "reply", "spawn", "shim", "client_start", "api_end_to_end"):
        values = [r[key] for r in runs]
        name = {"reply": "phase_request_to_reply", "spawn": "phase_request_to_spawn",
                "shim": "phase_spawn_to_first_instruction"}.get(key, key if key.startswith("step") else f"step_{key}")
        out[f"{name}_p50_s"] = round(statistics.median(values), 4)
        out[f"{name}_p99_s"] = round(percentile(values, 0.99), 4)
    out["gang_start_p50_s"] = round(statistics.median(gangs), 4)
    out["gang_start_p99_s"] = round(percentile(gangs, 0.99), 4)
    out["step_end_to_end_p50_s"] = round(statistics.median(cli), 4)
    out["step_end_to_end_p99_s"] = round(percentile(cli, 0.99), 4)
    if args.json:
        print(json.dumps(out))
        return
    for key, value in out.items():
        print(f"{key:42} {value}")


if __name__ == "__main__":
    main()
