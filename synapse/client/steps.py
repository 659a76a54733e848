"""Steps inside an allocation, for any program that drives Synapse: `synctl step`, and `synctl run`
inside an allocation (`SYNAPSE_ALLOC` set by `synctl alloc`).

A step is a job of its own, `<alloc>.<k>` (synapse.core.steps): once `start_step` returns its id,
everything that works on a job works on it: `GetJob` (and `wait_step` here), its events, `LogAccess`
tickets and the workers' `ReadLog` for its tasks' output (`synctl logs`), `CancelJob`, the
history store. Nothing but the start differs, and the start never queues: it runs at once or is
refused (gRPC FAILED_PRECONDITION, with what the allocation has left).
"""

from __future__ import annotations

import time

from synapse.client.master_client import ClusterUnavailable, MasterClient
from synapse.core.jobs import wire
from synapse.core.jobs.jobspec import MIN_TASK_MEMORY
from synapse.core.model import JobSpec, Resources
from synapse.proto import api_pb2

#: The environment variable `synctl alloc` gives its command: the allocation's job id.
ALLOC_ENV = "SYNAPSE_ALLOC"
#: A step's end, as GetJob shows it.
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def step_spec(alloc: api_pb2.JobInfo, command: tuple[str, ...], *, tasks: int | None = None,
              cpu: int | None = None, memory: int | None = None, gpu: int | None = None,
              env: tuple[tuple[str, str], ...] = (), name: str = "") -> JobSpec:
    """A step's spec inside allocation `alloc` (its JobInfo). As `srun` in `salloc`: by default one
    task per task of the allocation, each with all of it; a resource not given is a share of the
    allocation task's: as large a share as the largest of those given (`--gpu 4` of 8: half its
    cpu and memory too), and no more than an even share among the step tasks that land on one
    allocation task (cpu in millicores, memory in bytes)."""
    whole = wire.job_spec_from_proto(alloc.spec)
    n = tasks or whole.tasks
    held = whole.resources
    fraction = 1 / -(-n // whole.tasks)  # an even share among the step tasks on one allocation task
    given = [want / have for want, have in ((cpu, held.cpu), (memory, held.memory), (gpu, held.gpu))
             if want is not None and have > 0]
    if given:
        fraction = min(fraction, max(given))
    share_memory = int(held.memory * fraction)
    resources = Resources(int(held.cpu * fraction) if cpu is None else cpu,
                          (share_memory if share_memory >= MIN_TASK_MEMORY else 0) if memory is None else memory,
                          int(held.gpu * fraction) if gpu is None else gpu)
    return JobSpec(name=name or f"{whole.name}-step", tasks=n, resources=resources, command=tuple(command),
                   env=tuple(sorted(env)))


def start_step(client: MasterClient, alloc_id: str, spec: JobSpec, request_id: str | None = None) -> str:
    """Start `spec` as a step of running allocation `alloc_id`; its job id. Raises ClientError
    (FAILED_PRECONDITION) with the reason when it does not fit beside the allocation's running
    steps or the allocation does not run; a retry with the same `request_id` gets the same step."""
    return client.start_step(alloc_id, wire.job_spec_to_proto(spec), request_id)


#: The job event (its cluster event's reason, synapse.core.state.events) that says a job reached each status.
REACHED = {"RUNNING": "GangRunning", "STOPPING": "GangStopping", "SUCCEEDED": "JobSucceeded",
            "FAILED": "JobFailed", "CANCELLED": "JobCancelled"}


def wait_step(client: MasterClient, step_id: str, *, until: frozenset[str] = ENDED,
              deadline: float | None = None) -> api_pb2.JobInfo:
    """The job's JobInfo (a step's, or any job's) once its status is in `until` (by default:
    ended). It follows the job's events (WatchEvents, from any master, pushed as they apply) rather
    than asking again and again, and reads the job when one says it got there; TimeoutError past
    `deadline` (time.monotonic)."""
    info = client.get_job(step_id)
    if info.status in until:
        return info
    reasons = {REACHED[s] for s in until if s in REACHED}
    remaining = None if deadline is None else max(0.1, deadline - time.monotonic())
    request = api_pb2.WatchEventsRequest(job_id=step_id, follow=True)
    try:
        for event in client.watch("WatchEvents", lambda: request, leader=False, try_timeout=remaining,
                                  deadline=remaining):
            if event.reason in reasons:
                info = client.get_job(step_id)
                if info.status in until:
                    return info
            if deadline is not None and time.monotonic() > deadline:
                break
    except ClusterUnavailable:
        if deadline is None or time.monotonic() < deadline:
            raise  # not the deadline: no master answered
    info = client.get_job(step_id)
    if info.status in until:
        return info
    raise TimeoutError(f"job {step_id} is still {info.status}")


def exit_status(info: api_pb2.JobInfo) -> int:
    """A step's exit status as a shell's: its tasks' highest exit code (128+N for signal N, as the
    workers report it); 1 for a step that ended without one of its tasks exiting non-zero yet did
    not succeed (cancelled before it ran, its node lost)."""
    codes = [t.exit_code for t in info.tasks if t.has_exit_code]
    worst = max(codes, default=0)
    return worst if worst or info.status == "SUCCEEDED" else 1
