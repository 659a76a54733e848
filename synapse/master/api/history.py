"""The cluster's past, for users: its events from this replica's applied state (WatchEvents), and
the history store's jobs and usage (ListHistory, GetUsage): check the request, query the store off
the event loop, convert its rows. Any replica serves them (the store is shared); users need no
database credentials, and see what `get jobs` shows them: every job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import grpc

from synapse.master.api.base import MAX_ID_CHARS, WATCH_REFRESH_S, Context, ServicerBase
from synapse.proto import api_pb2, types_pb2
from synapse.rpc import convert

if TYPE_CHECKING:  # SQLAlchemy's: imported by masters with a store only
    from synapse.history.exporter import History

_P = ParamSpec("_P")
_T = TypeVar("_T")
_Request = TypeVar("_Request")

#: The final states a history query may filter on.
STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
#: What usage may be grouped by.
USAGE_BY = ("user", "queue", "day")


class BadRequest(ValueError):
    """A history request the store must not be asked; the message names the field."""


class Unavailable(RuntimeError):
    """The store failed to answer; the message says why."""


async def _ask(query: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """A query of the history store, run on a thread."""
    from synapse.history.store import StoreError  # SQLAlchemy: loaded by masters with a store only

    try:
        return await asyncio.to_thread(query, *args, **kwargs)
    except StoreError as exc:
        raise Unavailable(str(exc)) from None


def request_problem(request: api_pb2.ListHistoryRequest) -> str:
    if request.state and request.state not in STATES:
        return f"state: must be one of {', '.join(STATES)}, not {request.state!r}"
    if request.since and request.until and request.until <= request.since:
        return "until: must be after since"
    if request.limit > 5000:
        return "limit: at most 5000"
    return ""


async def list_history(history: History, request: api_pb2.ListHistoryRequest) -> api_pb2.ListHistoryReply:
    """The matching jobs (raises BadRequest, or Unavailable when the store fails)."""
    from synapse.history.store import JobQuery

    problem = request_problem(request)
    if problem:
        raise BadRequest(problem)
    query = JobQuery(user=request.user, queue=request.queue, state=request.state, job_id=request.job_id,
                     since=request.since, until=request.until, limit=request.limit or 1000,
                     after_end=request.after_end, after_id=request.after_id)
    rows, more = await _ask(history.store.jobs, query)
    return api_pb2.ListHistoryReply(jobs=[_job(r) for r in rows], more=more)


async def usage(history: History, request: api_pb2.GetUsageRequest) -> api_pb2.GetUsageReply:
    by = request.by or "user"
    if by not in USAGE_BY:
        raise BadRequest(f"by: must be one of {', '.join(USAGE_BY)}, not {request.by!r}")
    if request.since and request.until and request.until <= request.since:
        raise BadRequest("until: must be after since")
    rows = await _ask(history.store.usage, by, request.since, request.until)
    days = await _ask(history.store.cluster_usage, request.since, request.until)
    return api_pb2.GetUsageReply(
        rows=[api_pb2.UsageRow(key=r["key"], gpu_hours=(r["gpu_seconds"] or 0.0) / 3600,
                               cpu_hours=(r["cpu_seconds"] or 0.0) / 3600, jobs=int(r["jobs"] or 0),
                               goodput=_goodput(r)) for r in rows],
        cluster_days=[_cluster(d["day"], d) for d in days],
        cluster_total=_cluster("", {name: sum(d[name] or 0.0 for d in days) for name in _CLUSTER_FIELDS}))


#: The store's cluster columns (seconds) and the reply's fields (hours) they fill.
_CLUSTER_FIELDS = {f"{state}_{kind}_seconds": f"{state}_{kind}_hours"
                   for kind in ("gpu", "cpu") for state in ("allocated", "idle", "down")}


def _cluster(day: str, row: dict[str, Any]) -> api_pb2.ClusterUsage:
    return api_pb2.ClusterUsage(day=day, **{hours: (row[seconds] or 0.0) / 3600
                                            for seconds, hours in _CLUSTER_FIELDS.items()})


def _goodput(row: dict[str, Any]) -> api_pb2.Goodput:
    """A store row's goodput columns (history schema version 3)."""
    from synapse.history.schema import goodput_of_row  # SQLAlchemy: loaded by masters with a store only

    return convert.goodput_to_proto(goodput_of_row(row))


def _resources(row: dict[str, Any]) -> types_pb2.Resources:
    return types_pb2.Resources(cpu_millis=row["cpu_millis"], memory_bytes=row["memory_bytes"], gpu=row["gpus"])


def _nodes(text: str) -> list[str]:
    return text.split(",") if text else []


def _job(row: dict[str, Any]) -> api_pb2.HistoryJob:
    return api_pb2.HistoryJob(
        job_id=row["job_id"], name=row["name"], user=row["user_name"], queue=row["queue"], priority=row["priority"],
        submit=row["submit_at"], eligible=row["eligible_at"], start=row["start_at"], end=row["end_at"],
        state=row["state"], reason=row["reason"], detail=row["detail"], exit_code=row["exit_code"],
        attempts=row["attempts"], tasks=row["tasks"], nodes=_nodes(row["nodes"]), resources=_resources(row),
        gpu_seconds=row["gpu_seconds"], cpu_seconds=row["cpu_seconds"], time_limit_s=row["time_limit"],
        cancelled_by=row["cancelled_by"], preemptions=row["preemptions"],
        runs=[api_pb2.HistoryRun(attempt=r["attempt"], start=r["start_at"], running=r["running_at"], end=r["end_at"],
                                 nodes=_nodes(r["nodes"]), tasks=r["tasks"], resources=_resources(r),
                                 outcome=r["outcome"], reason=r["reason"], exit_code=r["exit_code"],
                                 gpu_seconds=r["gpu_seconds"], cpu_seconds=r["cpu_seconds"],
                                 checkpoint_at=r.get("checkpoint_at") or 0.0) for r in row["runs"]],
        goodput=_goodput(row))


class HistoryApi(ServicerBase):
    """WatchEvents, ListHistory, GetUsage."""

    async def WatchEvents(self, request: api_pb2.WatchEventsRequest,
                          context: Context) -> AsyncIterator[api_pb2.ClusterEventInfo]:
        """The cluster's events after a cursor, from this replica's applied state (any replica)."""
        for field, value in (("job_id", request.job_id), ("node_id", request.node_id)):
            if len(value) > MAX_ID_CHARS:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: at most {MAX_ID_CHARS} characters")
        cursor = request.after
        if cursor <= 0:  # from the oldest event kept
            with self.m.lock:
                cursor = self.m.state.cluster_events[0].seq - 1 if self.m.state.cluster_events else 0
        while True:
            changed = self.m.state_changed()
            with self.m.lock:
                events = self.m.state.events_after(cursor)
                oldest = self.m.state.cluster_events[0].seq if self.m.state.cluster_events else 0
            if events is None:
                await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                    f"cursor {cursor} is too old: the oldest event kept is {oldest}; "
                                    "start again from 0 (and re-read the state)")
            for e in events:
                cursor = e.seq
                if (request.job_id and (e.topic != "job" or e.object_id != request.job_id)) or \
                        (request.node_id and (e.topic != "node" or e.object_id != request.node_id)):
                    continue
                yield api_pb2.ClusterEventInfo(seq=e.seq, at=e.at, type=e.type, topic=e.topic, reason=e.reason,
                                               object_id=e.object_id, message=e.message)
            if not request.follow:
                return
            if self.m.stopping:
                await self._abort_stopping(context)
            try:
                await asyncio.wait_for(changed.wait(), WATCH_REFRESH_S)
            except TimeoutError:
                pass

    async def ListHistory(self, request: api_pb2.ListHistoryRequest, context: Context) -> api_pb2.ListHistoryReply:
        return await self._from_history(list_history, request, context)

    async def GetUsage(self, request: api_pb2.GetUsageRequest, context: Context) -> api_pb2.GetUsageReply:
        return await self._from_history(usage, request, context)

    async def _from_history(self, query: Callable[[History, _Request], Awaitable[_T]], request: _Request,
                            context: Context) -> _T:
        """Answer from the history store (any replica): INVALID_ARGUMENT for a bad request,
        FAILED_PRECONDITION without a store or while it fails (not UNAVAILABLE: every replica
        shares the store, so a client trying the others would only wait longer)."""
        if self.m.history is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this cluster keeps no job history (set history.url in the cluster file)")
        try:
            return await query(self.m.history, request)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Unavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"history store unavailable: {exc}")
