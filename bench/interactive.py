"""Interactive work: `synctl run -- true` end to end, a step's start inside an allocation and `synctl
run -- true` as a step, and synctl's own start, on an idle local TLS cluster (3 masters, 2 workers).

    python bench/interactive.py              # 30 trials of each
    python bench/interactive.py --quick      # 5 of each (for CI)
    python bench/interactive.py --json       # {"run_end_to_end_p50_s", "step_start_p50_s",
                                             #  "step_end_to_end_p50_s", "cli_start_p50_s", ... (and p99s),
                                             #  "run_phases_p50_s": {...}}

run_end_to_end: from the exec of `synctl run -- true` (stdin /dev/null) to its exit, one at a time:
synctl's start, the submission, the gang's placement and start, the attach to the task's worker,
the task (its stdin host beside it), its end as the masters record it, and synctl's exit. Where
the time goes (p50 of each phase, from the job's events, stamped by the leader's clock, which is
this machine's): exec -> Submitted (synctl's start and the submission), Submitted -> Running (the
round, the commit, the worker's start), Running -> the job's end (the task, and its exit reported
and committed), the end -> synctl's exit (the last output, the status read).

step_start: inside an allocation of 2 tasks held for the bench, a step's own path, from its StartStep
reaching the leader to the step's first instruction on its last node (bench/steps.py's trial, which
prints its phases). step_end_to_end: `synctl run -- true` with SYNAPSE_ALLOC set (a step, no
queueing), from exec to exit.

cli_start: `synctl --version`, from exec to exit (no verb module, no gRPC imported).

Targets (issue 46, p50): step start at most 0.05 s, step end to end at most 0.2 s, run end to end at
most 0.3 s, CLI start at most 0.1 s. Slurm 22.05 on the same machine (the issue's window): a step
(`srun -N2 true` inside `salloc`) 0.041 s end to end, `srun -N2 --gres=gpu:8 true` alone 0.047 s.
"""

from __future__ import annotations

import argparse
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

from steps import trial as step_trial  # noqa: E402
from support.measure import percentile  # noqa: E402

from synapse.client.master_client import MasterClient  # noqa: E402
from synapse.client.steps import wait_step  # noqa: E402
from synapse.core import codec  # noqa: E402
from synapse.core.model import JobSpec, Resources  # noqa: E402
from synapse.local import cluster as local  # noqa: E402

#: synctl as a user runs it: the installed entry point beside this interpreter.
SYNCTL = Path(sys.executable).with_name("synctl")
ENDS = ("Succeeded", "Failed", "Cancelled")


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from the exec of `argv` to its exit; it must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    return took


def run_trials(client: MasterClient, env: dict[str, str], trials: int) -> tuple[list[float], dict[str, list[float]]]:
    """`synctl run -- true`, `trials` times; the wall times, and each trial's phases."""
    totals: list[float] = []
    phases: dict[str, list[float]] = {"exec_to_submitted": [], "submitted_to_running": [], "running_to_end": [],
                                      "end_to_exit": []}
    for trial in range(trials):
        name = f"bench-run-{trial}"
        began = time.time()
        totals.append(timed([str(SYNCTL), "run", "--name", name, "--", "true"], env))
        ended = began + totals[-1]
        job = next(j for j in client.list_jobs() if j.spec.name == name)
        at = {e.kind: e.at for e in client.get_job(job.id).events}
        end = next(at[k] for k in ENDS if k in at)
        phases["exec_to_submitted"].append(at["Submitted"] - began)
        phases["submitted_to_running"].append(at["Running"] - at["Submitted"])
        phases["running_to_end"].append(end - at["Running"])
        phases["end_to_exit"].append(ended - end)
    return totals, phases


def step_trials(client: MasterClient, data_dir: Path, env: dict[str, str],
                trials: int) -> tuple[list[float], list[float]]:
    """Inside an allocation of 2 tasks x 8 GPUs: each step's start (bench/steps.py's trial), then
    `synctl run -- true` as a step, from exec to exit."""
    marks = data_dir.parent / "marks"
    marks.mkdir(exist_ok=True)
    spec = JobSpec(name="bench-alloc", tasks=2, resources=Resources(1000, 1 << 30, 8), command=(), alloc=True,
                   idle_timeout=3600.0)
    alloc_id = client.submit_job(codec.job_spec_to_proto(spec)).job_id
    info = wait_step(client, alloc_id, until=frozenset({"RUNNING"}), deadline=time.monotonic() + 60)
    step_trial(client, data_dir, marks, alloc_id, info, -1)  # warm: connections, the workers' first spawns
    starts = [step_trial(client, data_dir, marks, alloc_id, info, i)["step_start"] for i in range(trials)]
    in_alloc = {**env, "SYNAPSE_ALLOC": alloc_id}
    ends = [timed([str(SYNCTL), "run", "--", "true"], in_alloc) for _ in range(trials)]
    client.cancel(alloc_id)
    return starts, ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="5 trials of each (for CI)")
    args = parser.parse_args()
    if args.quick:
        args.trials = 5
    with tempfile.TemporaryDirectory(prefix="synapse-bench-interactive-") as tmp:
        data_dir = Path(tmp) / "cluster"
        state = local.up(data_dir, 3, 2, 1, 8, local.free_base_port(3))
        try:
            # synctl as a user's install runs it: with its bytecode cached. Where the environment
            # says PYTHONDONTWRITEBYTECODE (some CI machines, some sandboxes), every exec would
            # compile each module it imports again, which measured 0.1-0.2 s more per command.
            env = {k: v for k, v in {**os.environ, **local.client_env(state)}.items() if k != "PYTHONDONTWRITEBYTECODE"}
            client = MasterClient([m["api_address"] for m in state["masters"]], state["token"],
                                  tls=local.client_tls(state))
            timed([str(SYNCTL), "run", "--", "true"], env)  # warm: the page cache, the leader's first round
            cli = [timed([str(SYNCTL), "--version"], env) for _ in range(args.trials)]
            totals, phases = run_trials(client, env, args.trials)
            step_starts, step_ends = step_trials(client, data_dir, env, args.trials)
            client.close()
        finally:
            local.down(data_dir)
    report = {"run_end_to_end_p50_s": round(statistics.median(totals), 4),
              "run_end_to_end_p99_s": round(percentile(totals, 0.99), 4),
              "step_start_p50_s": round(statistics.median(step_starts), 4),
              "step_start_p99_s": round(percentile(step_starts, 0.99), 4),
              "step_end_to_end_p50_s": round(statistics.median(step_ends), 4),
              "step_end_to_end_p99_s": round(percentile(step_ends, 0.99), 4),
              "cli_start_p50_s": round(statistics.median(cli), 4), "cli_start_p99_s": round(percentile(cli, 0.99), 4),
              "run_phases_p50_s": {k: round(statistics.median(v), 4) for k, v in phases.items()},
              "trials": args.trials, "load_1min": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(report))
        return
    print(f"synctl run -- true, end to end: p50 {report['run_end_to_end_p50_s']:.3f} s, "
          f"p99 {report['run_end_to_end_p99_s']:.3f} s ({args.trials} trials; target p50 <= 0.3 s)")
    for phase, value in report["run_phases_p50_s"].items():  # type: ignore[union-attr]
        print(f"  {phase:22} p50 {value:.3f} s")
    print(f"a step's start in an allocation: p50 {report['step_start_p50_s']:.3f} s, p99 "
          f"{report['step_start_p99_s']:.3f} s (target p50 <= 0.05 s)")
    print(f"synctl run -- true as a step: p50 {report['step_end_to_end_p50_s']:.3f} s, p99 "
          f"{report['step_end_to_end_p99_s']:.3f} s (target p50 <= 0.2 s)")
    print(f"synctl --version: p50 {report['cli_start_p50_s']:.3f} s, p99 {report['cli_start_p99_s']:.3f} s "
          f"(target p50 <= 0.1 s)")
    print(f"load average (1 min) at the end: {report['load_1min']}")


if __name__ == "__main__":
    main()
