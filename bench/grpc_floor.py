"""The floor under every master call: CPU a Python gRPC server spends on one trivial unary call.

    python bench/grpc_floor.py [--calls 6000] [--threads 16]

A server process answers GetJob with a constant reply (no state, no Raft), through the same
generated service, as the master's asyncio server does (on uvloop, the master's loop, and on
asyncio's own) and as a thread-pool server would; 16 client threads call it. It prints calls per
second and the server's CPU time per call, each kind in turn, three rounds, then the median of
each. Whatever a master does per submission comes on top of this floor.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.measure import cpu_seconds  # noqa: E402

from synapse.local.cluster import free_base_port  # noqa: E402
from synapse.proto import api_pb2, api_pb2_grpc  # noqa: E402


class AsyncServicer(api_pb2_grpc.MasterServicer):
    async def GetJob(self, request, context):  # noqa: N802 - the gRPC method name
        return api_pb2.JobInfo(id=request.job_id, status="PENDING")


class SyncServicer(api_pb2_grpc.MasterServicer):
    def GetJob(self, request, context):  # noqa: N802
        return api_pb2.JobInfo(id=request.job_id, status="PENDING")


def _serve(kind: str, port: int, ready, done) -> None:
    if kind in ("asyncio", "uvloop"):
        async def main() -> None:
            server = grpc.aio.server()
            api_pb2_grpc.add_MasterServicer_to_server(AsyncServicer(), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait)
            await server.stop(0)
        if kind == "uvloop":
            import uvloop
            uvloop.run(main())
        else:
            asyncio.run(main())
    else:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_MasterServicer_to_server(SyncServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        ready.set()
        done.wait()
        server.stop(0)


def measure(kind: str, calls: int, threads: int) -> tuple[float, float]:
    """(calls per second, server CPU milliseconds per call)."""
    port = free_base_port(1)
    ready, done = multiprocessing.Event(), multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(kind, port, ready, done))
    server.start()
    try:
        if not ready.wait(20):
            raise SystemExit(f"{kind} server did not start")

        def client(k: int, n: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = api_pb2_grpc.MasterStub(channel)
                for _ in range(k, n, threads):
                    stub.GetJob(api_pb2.GetJobRequest(job_id="x"), timeout=10)

        client(0, 200)  # warm up
        cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
        pool = [threading.Thread(target=client, args=(k, calls)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
        return calls / elapsed, cpu * 1000 / calls
    finally:
        done.set()
        server.join(10)
        if server.is_alive():
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a few seconds, same code path: 300 calls, 4 threads")
    args = parser.parse_args()
    kinds, rounds = ("uvloop", "asyncio", "thread pool"), 3
    if args.quick:
        args.calls, args.threads, rounds = 300, 4, 1
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    runs: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:  # interleaved, each order in turn
            rate, ms = measure(kind, args.calls, args.threads)
            runs[kind].append(ms)
            print(f"{kind:<12} server: {rate:,.0f} calls/s, {ms:.3f} ms of server CPU per call")
    for kind, ms in runs.items():
        print(f"median {kind:<12} {statistics.median(ms):.3f} ms per call ({' / '.join(f'{m:.3f}' for m in ms)})")


if __name__ == "__main__":
    main()
