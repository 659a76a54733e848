"""The unit suite starts no process and serves on no port: a test here that tries fails, saying so.

Starting a program (subprocess, multiprocessing, fork), binding or listening on a socket (a Raft node,
an HTTP or asyncio server) and making a gRPC server are refused while a test of tests/unit runs; such
a test belongs in tests/cluster (docs/development.md, "Two suites")."""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess

import grpc
import pytest


class StartsAProcessOrServer(BaseException):
    """Raised where a unit test starts a program or a server. A BaseException, so the `except
    Exception` of the code under test does not swallow it."""


def _refuse(what: str, log: list[str]):
    def refused(*args, **kwargs):
        log.append(what)
        raise StartsAProcessOrServer(f"a unit test may not {what}: it belongs in tests/cluster")
    return refused


_REFUSED = pytest.StashKey[list[str]]()


@pytest.fixture(autouse=True)
def _no_process_no_server(request, monkeypatch):
    tried = request.node.stash[_REFUSED] = []
    refusals = {
        (subprocess.Popen, "_execute_child"): "start a program",
        (_posixsubprocess, "fork_exec"): "start a program",  # multiprocessing's spawn
        (os, "fork"): "fork",
        (os, "forkpty"): "fork",
        (os, "posix_spawn"): "start a program",
        (os, "posix_spawnp"): "start a program",
        (os, "system"): "start a program",
        (socket.socket, "bind"): "bind a socket",
        (socket.socket, "listen"): "listen on a socket",
        (grpc, "server"): "make a gRPC server",
        (grpc.aio, "server"): "make a gRPC server",
    }
    for (owner, name), what in refusals.items():
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, _refuse(what, tried))
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test passes only if nothing was refused, even where the code under test caught the refusal."""
    report = yield
    tried = item.stash.get(_REFUSED, [])
    if call.when == "call" and tried and report.passed:
        report.outcome = "failed"
        report.longrepr = f"a unit test may not {tried[0]}: it belongs in tests/cluster (the refusal was caught)"
    return report
