"""What every synctl verb shares: the global options as a `Context` (its `MasterClient` built on
first use), and how a verb fails, runs a call and prints its answer.

Errors are one clear line on stderr and a non-zero exit (`exits`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
import grpc

from synapse.client import render
from synapse.client.cli.exits import EXIT_DENIED, EXIT_INTERRUPTED
from synapse.client.master_client import (
    AuthError,
    ClientError,
    ClusterUnavailable,
    MasterClient,
    PermissionDenied,
    TLSError,
    UnknownHosts,
    address_problem,
    parse_addresses,
)
from synapse.common.cli import fail as common_fail
from synapse.common.tls import TLSFiles

_T = TypeVar("_T")

#: How long every master address may refuse connections, before any master answered, until a
#: command gives up (exit 3; MasterClient.absent_s): a mistyped port or a cluster that is down fails
#: within 2 s of the command's start, not after --timeout.
ABSENT_S = 1.0

#: `-o/--output` as most verbs take it.
OUTPUT = click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table",
                      show_default=True, help="output format")


class Context:
    """synctl's global options, and the client to the masters they describe (built on first use)."""

    def __init__(self, masters: str, token: str, timeout: float, ca: str, cert: str, key: str) -> None:
        self.masters, self.token, self.timeout = masters, token, timeout  #: as given: flags or environment
        self.tls = TLSFiles(ca, cert, key)  #: the TLS files, if the cluster uses TLS
        self._client: MasterClient | None = None  #: set by `client` on first use

    @property
    def client(self) -> MasterClient:
        """The client to the masters; a bad address or unreadable TLS file fails the command."""
        if self._client is None:
            addresses = parse_addresses(self.masters)
            if not addresses:
                fail("no masters given: use --masters host:port[,host:port…] or set SYNAPSE_MASTERS", 2)
            problem = next(filter(None, map(address_problem, addresses)), "")
            if problem:
                fail(f"bad master address {problem} (--masters / SYNAPSE_MASTERS)", 2)
            if self.tls.enabled:
                try:
                    self.tls.read()
                except OSError as exc:
                    fail(f"TLS failed: cannot read {exc.filename}: {exc.strerror} (check --ca / SYNAPSE_CA, "
                         "--cert, --key)", 4)
            self._client = MasterClient(addresses, self.token, deadline=self.timeout, tls=self.tls,
                                        absent_s=ABSENT_S)
        return self._client


class AfterDashes(click.Command):
    """A verb whose words after the first `--` are a command to run (`submit`, `alloc`, `step`),
    never its own arguments: they are left in `ctx.meta["synctl.command"]`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta["synctl.command"] = args[args.index("--") + 1:]
            args = args[:args.index("--")]
        return super().parse_args(ctx, args)


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, `synctl: MESSAGE`, and exit `code`."""
    common_fail("synctl", message, code)


def run(action: Callable[[], _T]) -> _T:
    """Run a client action, turning its failures into one line and an exit code."""
    try:
        return action()
    except TLSError as exc:
        fail(f"TLS failed: {exc.message} (check --ca / SYNAPSE_CA, --cert, --key)", 4)
    except PermissionDenied as exc:
        fail(exc.message, EXIT_DENIED)
    except AuthError as exc:
        fail(f"authentication failed: {exc.message} (check --token / SYNAPSE_TOKEN)", 4)
    except ClientError as exc:
        prefix = {grpc.StatusCode.NOT_FOUND: "not found", grpc.StatusCode.INVALID_ARGUMENT: "rejected",
                  grpc.StatusCode.ALREADY_EXISTS: "refused", grpc.StatusCode.RESOURCE_EXHAUSTED: "refused",
                  grpc.StatusCode.FAILED_PRECONDITION: "refused"}
        fail(f"{prefix.get(exc.code, exc.code.name.lower())}: {exc.message}", 2)
    except UnknownHosts as exc:
        fail(f"bad master address: {exc} (--masters / SYNAPSE_MASTERS)", 2)
    except ClusterUnavailable as exc:
        fail(f"cluster unreachable: {exc}", 3)


def emit(data: Any, output: str, text: Callable[[Any], str]) -> None:
    """Print `data` as `output` asks: json, yaml, or `text(data)` for a table or a description."""
    click.echo(render.formatted(data, output, text))


def interrupted(job_id: str, again: str, status: str = "") -> NoReturn:
    """Ctrl-C while following a job: it goes on; say how to come back to it. The process leaves at
    once (os._exit, its output flushed): threads still streaming a task's output (`logs -f`) would
    otherwise write to stdout while the interpreter shuts down, which aborts it (SIGABRT, "could not
    acquire lock for <stdout> at interpreter shutdown") instead of exiting 130."""
    click.echo(f"synctl: interrupted; job {job_id} goes on{f' ({status})' if status else ''}: `synctl {again}` "
               f"follows it again, `synctl cancel {job_id}` cancels it", err=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_INTERRUPTED)
