"""The users' RPC for interactive work on their running jobs: tickets to attach to a job's tasks
(`synctl run`) or to start a command in one task's sandbox (`synctl exec`), which the tasks'
workers check (synapse.worker.attach). For the job's owner and admins, as its logs are; every exec
is first recorded as the job's event (RecordExec), so none goes unrecorded."""

from __future__ import annotations

import logging

import grpc

from synapse.common import tickets
from synapse.core import commands as c
from synapse.core.model import JobStatus
from synapse.master.api.base import Context, ServicerBase
from synapse.proto import api_pb2

log = logging.getLogger(__name__)

#: The most an exec's command may hold (its words' characters together), and its words.
MAX_EXEC_CHARS = 16 << 10
MAX_EXEC_WORDS = 1024


class InteractiveApi(ServicerBase):
    """AttachAccess."""

    async def AttachAccess(self, request: api_pb2.AttachAccessRequest, context: Context) -> api_pb2.AttachAccessReply:
        """Attach tickets for every task of a job's latest placed attempt, or (with a command) an exec
        ticket for one task of its running attempt, once the exec is recorded."""
        await self._check_id(request.job_id, "job_id", context)
        command = tuple(request.command)
        if command and (len(command) > MAX_EXEC_WORDS or sum(map(len, command)) > MAX_EXEC_CHARS
                        or not command[0]):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"command: a program and at most {MAX_EXEC_WORDS} words, {MAX_EXEC_CHARS} characters")
        if command:  # its one proposal (its event) orders it after every write before it
            await self._leader(context)
            return await self._exec_ticket(request, command, context)
        await self._current_read(context)
        attempt, nodes, addresses, ranks, _ = await self._placed(request.job_id, "attach to", context)
        expires = self.m.now() + tickets.TICKET_TTL_S
        return api_pb2.AttachAccessReply(attempt=attempt, expires_at=expires, tickets=[
            api_pb2.LogTicket(index=i, node_id=node, address=addresses[node], rank=ranks.get(i, i),
                              ticket=tickets.sign(self.m.node_credential(node), request.job_id, attempt, i,
                                                  expires, tickets.ATTACH))
            for i, node in enumerate(nodes)])

    async def _exec_ticket(self, request: api_pb2.AttachAccessRequest, command: tuple[str, ...],
                           context: Context) -> api_pb2.AttachAccessReply:
        """An exec ticket for one task of the job's running attempt, once the exec is recorded."""
        attempt, nodes, addresses, ranks, status = await self._placed(request.job_id, "exec into", context)
        if status is not JobStatus.RUNNING:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"job {request.job_id} is {status.value}: exec needs a RUNNING job")
        if not 0 <= request.index < len(nodes):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"index: job {request.job_id} has tasks 0..{len(nodes) - 1}")
        caller = self.caller()
        result = await self._propose(c.RecordExec(at=self.m.now(), by=caller.name, job_id=request.job_id,
                                                  attempt=attempt, index=request.index, command=command), context)
        await self._ok_or_abort(result, context)
        log.info("exec allowed user=%s job=%s attempt=%d index=%d", caller.name, request.job_id, attempt,
                 request.index)
        node = nodes[request.index]
        expires = self.m.now() + tickets.TICKET_TTL_S
        return api_pb2.AttachAccessReply(attempt=attempt, expires_at=expires, tickets=[
            api_pb2.LogTicket(index=request.index, node_id=node, address=addresses[node],
                              rank=ranks.get(request.index, request.index),
                              ticket=tickets.sign(self.m.node_credential(node), request.job_id, attempt,
                                                  request.index, expires, tickets.exec_purpose(command)))])

    async def _placed(self, job_id: str, verb: str, context: Context
                      ) -> tuple[int, tuple[str, ...], dict[str, str], dict[int, int], JobStatus]:
        """The job's latest placed attempt (attempt, nodes by task index, node addresses, ranks by
        index, status), for its owner or an admin; aborts otherwise, or if it has none yet."""
        caller = self.caller()
        with self.m.lock:
            state = self.m.state
            job = state.jobs.get(job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {job_id}")
            attempt = max(job.placements, default=0)
            nodes = job.placements.get(attempt) or ()
            addresses = {n: state.nodes[n].address if n in state.nodes else "" for n in nodes}
            ranks = {t.index: t.rank for t in job.tasks} if job.attempt == attempt else {}
            owner, status = job.user, job.status
        if not caller.is_admin and owner != caller.name:
            log.info("permission denied method=AttachAccess user=%s job=%s owner=%s verb=%s", caller.name, job_id,
                     owner, verb)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not {verb} job {job_id}: it belongs to "
                                f"{owner or 'no user'}; only its owner or an admin may")
        if not nodes:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} has not started yet "
                                                                     f"({status.value})")
        return attempt, nodes, addresses, ranks, status
