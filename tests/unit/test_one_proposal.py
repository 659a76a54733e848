"""No endpoint proposes more than once per request (issue 37): a request whose work took two log
entries could be left half done by a leader change between them.

The check reads the servicer's modules, synapse/master/api/*.py (one mixin per audience, and their
base): for every RPC of the Master service it counts, along
each path through the method (and the servicer's own helpers it calls), the proposals made: calls
of `_propose`/`_propose_all` (one log entry each, however many commands), of the Master's
`propose`/`propose_all` and of pysyncobj's membership change. A proposal inside a loop or a
comprehension counts as unbounded. Branches count as the most any one path makes, so a legacy
branch and the current one do not add up. The few RPCs allowed more are listed with the reason.
tests/cluster/test_one_proposal.py shows that a group of commands does travel as one log entry.
"""

from __future__ import annotations

import ast
import math

from synapse.master.access import ACCESS
from tests.support import paths

API = paths.ROOT / "synapse" / "master" / "api"

#: Methods of the servicer that are one proposal each (their own bodies are not walked).
PROPOSING_HELPERS = {"_propose", "_propose_all"}
#: Calls of other objects that append a log entry: (attribute chain's last name).
PROPOSING_CALLS = {"propose", "propose_all", "propose_async", "propose_all_async", "change_membership"}

#: RPCs that may make more than one proposal, how many, and why.
EXCEPTIONS = {
    # pysyncobj appends its own membership entry; it cannot share a log entry with a command. The
    # replica's addresses are recorded before it joins (so every replica can name it at once) and
    # marked removed after it left (a failed removal leaves it listed, and a retry finishes it).
    "AddReplica": 2,
    "RemoveReplica": 2,
}


def _chain_last(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_self_call(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"


class ProposalCounter:
    """The most proposals any path through a servicer method makes (math.inf: unbounded)."""

    def __init__(self, methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> None:
        self.methods = methods
        self._memo: dict[str, float] = {}

    def of_method(self, name: str) -> float:
        if name in PROPOSING_HELPERS:
            return 1
        if name not in self._memo:
            self._memo[name] = 0  # recursion guard
            through, returned = self._block(self.methods[name].body, 0)
            self._memo[name] = max(returned, 0 if through is None else through)
        return self._memo[name]

    def _expr(self, node: ast.AST) -> float:
        """Proposals an expression (or a statement's own expressions) makes."""
        total = 0.0
        for sub in ast.walk(node):
            if isinstance(sub, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp | ast.Lambda):
                inner = sum(self._expr(child) for child in ast.iter_child_nodes(sub))
                if inner:
                    return math.inf
            if not isinstance(sub, ast.Call):
                continue
            name = _chain_last(sub.func)
            if _is_self_call(sub.func) and name in self.methods | dict.fromkeys(PROPOSING_HELPERS):
                total += self.of_method(name)
            elif name in PROPOSING_CALLS and not _is_self_call(sub.func):
                total += 1
        return total

    def _block(self, stmts: list[ast.stmt], start: float) -> tuple[float | None, float]:
        """(most proposals on a path falling through the block or None if none does, most on a path
        that returned or raised inside it)."""
        current: float | None = start
        returned = -math.inf
        for stmt in stmts:
            if current is None:
                break
            if isinstance(stmt, ast.If):
                current += self._expr(stmt.test)
                body, body_ret = self._block(stmt.body, current)
                other, other_ret = self._block(stmt.orelse, current)
                returned = max(returned, body_ret, other_ret)
                current = None if body is None and other is None else max(x for x in (body, other) if x is not None)
            elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
                inner = sum(self._expr(s) for s in stmt.body + stmt.orelse) + (
                    self._expr(stmt.iter) if isinstance(stmt, ast.For | ast.AsyncFor) else self._expr(stmt.test))
                current = current + (math.inf if inner else 0)
            elif isinstance(stmt, ast.Try):
                body, body_ret = self._block(stmt.body + stmt.orelse, current)
                returned = max(returned, body_ret)
                # A handler may be entered after any of the body's proposals: count them all.
                worst = max(x for x in (body, body_ret, current) if x is not None)
                ends = [] if body is None else [body]
                for handler in stmt.handlers:
                    handled, handler_ret = self._block(handler.body, worst)
                    returned = max(returned, handler_ret)
                    ends += [] if handled is None else [handled]
                final, _ = self._block(stmt.finalbody, 0)
                returned += final or 0
                current = max(ends) + (final or 0) if ends else None
            elif isinstance(stmt, ast.With | ast.AsyncWith):
                current += sum(self._expr(item.context_expr) for item in stmt.items)
                current, inner_ret = self._block(stmt.body, current)
                returned = max(returned, inner_ret)
            elif isinstance(stmt, ast.Return | ast.Raise):
                value = stmt.value if isinstance(stmt, ast.Return) else stmt.exc
                returned = max(returned, current + (self._expr(value) if value is not None else 0))
                current = None
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue  # a nested definition proposes only when called (counted where it is)
            else:
                current += self._expr(stmt)
        return current, returned


def class_methods(sources: list[str]) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods of every class in `sources` (the servicer's mixins), by name; a name defined twice
    is refused (one would hide the other from the walk, as from the servicer)."""
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for source in sources:
        for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
            for f in cls.body:
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert f.name not in methods or f.name == "__init__", f"{f.name} defined twice"
                    methods.setdefault(f.name, f)
    return methods


def proposals_per_rpc(sources: list[str], rpcs) -> dict[str, float]:
    counter = ProposalCounter(class_methods(sources))
    return {rpc: counter.of_method(rpc) for rpc in rpcs if rpc in counter.methods}


def test_no_endpoint_proposes_more_than_once_per_request():
    from synapse.master.api.servicer import MasterServicer

    counts = proposals_per_rpc([p.read_text() for p in sorted(API.glob("*.py"))], ACCESS)
    assert set(counts) == set(ACCESS), "every RPC is a method of the servicer's mixins"
    served_from = {rpc: getattr(MasterServicer, rpc).__module__ for rpc in ACCESS}
    assert all(m.startswith("synapse.master.api.") for m in served_from.values()), served_from
    too_many = {rpc: n for rpc, n in counts.items() if n > EXCEPTIONS.get(rpc, 1)}
    assert not too_many, f"RPCs that propose more than once per request: {too_many}"
    assert counts["SubmitJob"] == 1 and counts["DrainNode"] == 1 and counts["ReportTaskEvents"] == 1
    assert counts["GetJob"] == 1  # a current read's Barrier
    assert counts["ReplicaStatus"] == 0 and counts["Heartbeat"] == 0
    stale = {rpc for rpc, allowed in EXCEPTIONS.items() if counts.get(rpc, 0) <= 1}
    assert not stale, f"listed exceptions that no longer propose more than once (remove them): {stale}"


CHECKER_CASES = '''
class S:
    async def _propose(self, cmd, context): ...
    async def _propose_all(self, cmds, context): ...
    async def _read(self, context):
        await self._propose("barrier", context)
    async def One(self, request, context):
        if request.legacy:
            await self._propose("old", context)
            return 1
        await self._propose("new", context)
    async def Branches(self, request, context):
        if request.a:
            await self._propose("a", context)
        else:
            await self._propose_all(["b", "c"], context)
    async def Twice(self, request, context):
        await self._read(context)
        await self._propose("x", context)
    async def Loop(self, request, context):
        for x in request.items:
            await self._propose(x, context)
    async def Gathered(self, request, context):
        await asyncio.gather(*(self.m.propose(x) for x in request.items))
    async def Membership(self, request, context):
        await self.m.raft.change_membership("add", "a:1")
        await self._propose("record", context)
    async def Guarded(self, request, context):
        try:
            await self._propose("x", context)
        except Error:
            await self._propose("y", context)
    async def Nothing(self, request, context):
        return 0
'''


def test_the_checker_counts_paths_loops_helpers_and_membership():
    counts = proposals_per_rpc([CHECKER_CASES], ["One", "Branches", "Twice", "Loop", "Gathered",
                                                    "Membership", "Guarded", "Nothing"])
    assert counts == {"One": 1, "Branches": 1, "Twice": 2, "Loop": math.inf, "Gathered": math.inf,
                      "Membership": 2, "Guarded": 2, "Nothing": 0}


