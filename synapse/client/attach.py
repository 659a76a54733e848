"""Attaching to a job's tasks from a client: each task's stream to the worker that runs it (the
Worker service's Attach, with a ticket from the masters' AttachAccess), its output written out as
it comes (with `[rank N] ` before each line when asked), and the input a caller sends (stdin to
one task, signals to all, window size) passed on. `synctl run` and `synctl exec` drive it; so may
any program that drives Synapse.

A stream that breaks (the worker restarted, say) is opened again where its output left off, with a
fresh ticket, until the task has ended; how each task ended comes from the masters in the end
(`exit_status`), which also know the tasks whose worker could not say.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import grpc

from synapse.common.tls import TLSFiles, channel_credentials
from synapse.core.model import EndReason
from synapse.proto import api_pb2, api_pb2_grpc

#: How often, and how long, a broken stream is opened again before its task is given up on.
RETRY_S, RETRY_FOR_S = 0.5, 60.0
#: The ends that are a task's own (its exit code says how it went); the others are the cluster's.
OWN_ENDS = frozenset({EndReason.COMPLETED, EndReason.ERROR, EndReason.SIGNAL, EndReason.OOM_KILLED,
                      EndReason.COMMAND_NOT_FOUND})
#: Exit codes of the signals a gang's stop sends (SIGTERM, then SIGKILL): a rank that ended so while
#: another failed on its own was stopped because of it, and does not decide the exit status.
STOPPED_CODES = frozenset({128 + 15, 128 + 9})


def worker_channel(tls: TLSFiles, address: str, node_id: str) -> grpc.Channel:
    """A channel to a worker's service: over TLS when the cluster uses it, checking that the
    worker's certificate was issued to that node (not merely to some host at that address)."""
    if not tls.enabled:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, channel_credentials(tls),
                               options=[("grpc.ssl_target_name_override", node_id)])


def exit_status(tasks: Sequence[api_pb2.TaskInfo]) -> tuple[int, str]:
    """The exit status of a job's attempt as a shell would want it, and why when it is not a task's
    own: 0 when every task exited 0; else the largest exit code of the tasks that failed on their own
    (128+N for signal N), not counting the ranks the gang's stop then ended (STOPPED_CODES); a task
    the cluster stopped (cancelled, time limit, preempted, node lost…) or that never ran: its exit
    code or 1, and the reason."""
    own = [t for t in tasks if t.reason in OWN_ENDS and t.has_exit_code]
    failed = [t.exit_code for t in own if t.exit_code != 0]
    first_hand = [code for code in failed if code not in STOPPED_CODES]
    cluster = [t for t in tasks if t.reason and t.reason not in OWN_ENDS]
    if first_hand:
        return max(first_hand), ""
    if cluster:
        worst = cluster[0]
        why = f"task {worst.index} (rank {worst.rank}): {worst.reason}" + \
            (f": {worst.reason_message}" if worst.reason_message else "")
        codes = [t.exit_code for t in cluster if t.has_exit_code and t.exit_code]
        return (max(codes) if codes else 1), why
    if failed:
        return max(failed), ""
    return 0, ""


@dataclass
class Output:
    """Where the tasks' output goes: bytes written whole, lines labelled by rank when `label`."""

    stdout: BinaryIO
    stderr: BinaryIO
    label: bool
    ranks: dict[int, int]  #: task index -> rank
    lock: threading.Lock = field(default_factory=threading.Lock)
    partial: dict[tuple[int, str], bytes] = field(default_factory=dict)  #: a task's line not yet ended

    def write(self, index: int, stream: str, data: bytes) -> None:
        sink = self.stdout if stream == "stdout" else self.stderr
        if self.label:
            data = self._labelled(index, stream, data)
        if data:
            with self.lock:
                sink.write(data)
                sink.flush()

    def flush(self, index: int) -> None:
        """A task's last line, if it did not end with a newline."""
        for stream in ("stdout", "stderr"):
            rest = self.partial.pop((index, stream), b"")
            if rest:
                self.write_raw(stream, self._prefix(index) + rest + b"\n")

    def write_raw(self, stream: str, data: bytes) -> None:
        sink = self.stdout if stream == "stdout" else self.stderr
        with self.lock:
            sink.write(data)
            sink.flush()

    def _prefix(self, index: int) -> bytes:
        return f"[rank {self.ranks.get(index, index)}] ".encode()

    def _labelled(self, index: int, stream: str, data: bytes) -> bytes:
        data = self.partial.pop((index, stream), b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self.partial[(index, stream)] = rest
        prefix = self._prefix(index)
        return b"".join(prefix + line + b"\n" for line in lines)


class TaskStream:
    """One task's Attach stream: a thread that holds it (opening it again after a break), and the
    input queued for it."""

    def __init__(self, open_message: api_pb2.AttachOpen, connect: Callable[[], tuple[grpc.Channel, str]],
                 output: Output, gone: Callable[[], bool]) -> None:
        self.open = open_message  #: its ticket and offset are renewed on each reopening
        self.connect = connect  #: a channel to the task's worker and a fresh ticket
        self.output = output
        self.gone = gone  #: True once the masters say the task's attempt is over (stop retrying)
        #: input not yet handed to a stream (None: the end of input); guarded by `_more`
        self.inputs: collections.deque[api_pb2.AttachInput | None] = collections.deque()
        self._more = threading.Condition()
        self.ready = threading.Event()  #: the worker found the task (input now reaches it)
        self.done = threading.Event()
        self.exit_code: int | None = None  #: as the worker read it, if it could
        self.error = ""  #: why the stream was given up, if it was
        self.thread = threading.Thread(target=self._run, name=f"attach-{open_message.index}", daemon=True)

    def send(self, message: api_pb2.AttachInput) -> None:
        with self._more:
            self.inputs.append(message)
            self._more.notify_all()

    def close_input(self) -> None:
        with self._more:
            self.inputs.append(None)
            self._more.notify_all()

    def _requests(self, first: api_pb2.AttachInput, stop: threading.Event,
                  ready: threading.Event) -> Iterator[api_pb2.AttachInput]:
        """The stream's messages: the open, then input once the worker is ready for it. Input is
        taken only by a stream that is ready and not broken (a stream being opened to a worker that
        is not there yet must not swallow it); what is typed at the moment a worker dies may be lost."""
        yield first
        while not stop.is_set():
            with self._more:
                if not (ready.is_set() and self.inputs):
                    self._more.wait(0.1)
                    continue
                message = self.inputs.popleft()
            if message is None:
                return
            yield message

    def _run(self) -> None:
        given_up_at = time.monotonic() + RETRY_FOR_S
        try:
            while True:
                try:
                    self._once()
                    return
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED) \
                            or time.monotonic() > given_up_at or self.gone():
                        self.error = exc.details() or code.name
                        return
                    time.sleep(RETRY_S)
                except Exception as exc:  # the masters did not give a new ticket (yet): a failover, say
                    if time.monotonic() > given_up_at or self.gone():
                        self.error = str(exc)
                        return
                    time.sleep(RETRY_S)
        finally:
            self.output.flush(self.open.index)
            self.done.set()

    def _once(self) -> None:
        channel, ticket = self.connect()
        self.open.ticket = ticket
        stop, ready = threading.Event(), threading.Event()
        try:
            replies = api_pb2_grpc.WorkerStub(channel).Attach(
                self._requests(api_pb2.AttachInput(open=self.open), stop, ready))
            for reply in replies:
                if reply.ready:
                    ready.set()
                    self.ready.set()
                    with self._more:
                        self._more.notify_all()
                if reply.stdout:
                    self.output.write(self.open.index, "stdout", reply.stdout)
                if reply.stderr:
                    self.output.write(self.open.index, "stderr", reply.stderr)
                if reply.offset:
                    self.open.offset = reply.offset
                if reply.ended:
                    self.exit_code = reply.exit_code if reply.has_exit_code else None
                    return
        finally:
            stop.set()
            with self._more:
                self._more.notify_all()
            channel.close()
