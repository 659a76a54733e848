"""The master's event loop: uvloop by default (a dependency), asyncio's own when SYNAPSE_EVENT_LOOP says so."""

from __future__ import annotations

import asyncio

import pytest

from synapse.master.main import run_loop


def loop_module(kind: str) -> str:
    seen: list[str] = []

    async def which() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run_loop(which(), kind)
    return seen[0]


def test_the_master_runs_on_uvloop_unless_told_asyncio():
    assert loop_module("uvloop").startswith("uvloop")
    assert loop_module("asyncio").startswith("asyncio")


def test_an_unknown_loop_is_refused_before_anything_runs():
    ran: list[bool] = []

    async def main() -> None:
        ran.append(True)

    coroutine = main()
    with pytest.raises(SystemExit):
        run_loop(coroutine, "trio")
    coroutine.close()
    assert not ran
