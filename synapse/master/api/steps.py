"""The users' RPC about allocations: start a step inside one (synapse.core.steps)."""

from __future__ import annotations

import dataclasses
import logging

import grpc

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.jobs.jobspec import JobFileError, check_spec
from synapse.core.state.steps import step_problem
from synapse.core.state.transitions import live_steps
from synapse.core.steps import fit_step, rooms
from synapse.master.api.base import MAX_ID_CHARS, Context, ServicerBase
from synapse.proto import api_pb2

log = logging.getLogger(__name__)


class StepsApi(ServicerBase):
    """StartStep."""

    async def StartStep(self, request: api_pb2.StartStepRequest, context: Context) -> api_pb2.StartStepReply:
        """A step inside a running allocation, for its owner or an admin: started where it fits beside
        the allocation's running steps, in one command (no scheduling round), or refused with the
        reason (never queued). The fit is asked here first, so a refusal costs no log entry; apply
        asks it again (an allocation's other steps may have started in between)."""
        await self._check_id(request.alloc_id, "alloc_id", context)
        if len(request.request_id) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id: at most {MAX_ID_CHARS} characters")
        try:
            spec = codec.job_spec_from_proto(request.spec)
            if spec.secrets:
                raise JobFileError("spec.secrets", "a step takes none (give them to the allocation's jobs)")
            check_spec(spec, self.m.config.topology_levels, self.m.config.max_array_size)
        except (JobFileError, codec.CodecError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid step: {exc}")
        await self._leader(context)
        caller = self.caller()
        with self.m.lock:
            state = self.m.state
            alloc = state.jobs.get(request.alloc_id)
            existing = state.job_by_request.get(request.request_id) if request.request_id else None
            if alloc is not None:  # counted in its allocation's queue: the spec says so
                spec = dataclasses.replace(spec, queue=alloc.spec.queue)
            owner = alloc.user if alloc is not None else ""
            problem = step_problem(state, alloc, request.alloc_id, spec)
            if not problem and alloc is not None:
                fit = fit_step(rooms(alloc, live_steps(state, alloc)), spec.tasks, spec.resources)
                problem = fit if isinstance(fit, str) else ""
        if alloc is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown allocation {request.alloc_id}")
        if not caller.is_admin and owner != caller.name:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not start a step in allocation "
                                f"{request.alloc_id}: it belongs to {owner or 'no user'}")
        if existing is None and problem:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"step refused: {problem}")
        result = await self._propose(c.StartStep(at=self.m.now(), by=caller.name, alloc_id=request.alloc_id,
                                                 request_id=request.request_id, spec=spec), context)
        await self._ok_or_abort(result, context)
        log.debug("step started alloc=%s step=%s tasks=%d", request.alloc_id, result.value, spec.tasks)
        return api_pb2.StartStepReply(step_id=result.value)
