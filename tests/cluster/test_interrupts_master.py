"""A master stopped while calls wait on it ends them quietly: no CancelledError traceback in its log.

The streams must end by the replica's own answer (UNAVAILABLE, "is stopping"), not by the server
cancelling them when its grace runs out: that cancel can race the call's end, and grpc then logs
the CancelledError with a traceback (seen about once in a dozen CI runs on two cores)."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc

from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.local import cluster as local
from synapse.proto import api_pb2, api_pb2_grpc


def test_masters_stopped_while_streams_and_calls_wait_log_no_traceback(make_cluster):
    cluster = make_cluster(masters=3, workers=1)  # the worker keeps a WatchAssignments on the leader
    ended: list[str] = []
    channels = []
    for address in cluster.addresses:  # event streams that wait for the next event, on every master
        channel = cluster.channel(address)
        channels.append(channel)
        stream = api_pb2_grpc.MasterStub(channel).WatchEvents(api_pb2.WatchEventsRequest(follow=True),
                                                               metadata=(("authorization", f"Bearer {cluster.token}"),))

        def drain(stream=stream, address=address) -> None:
            try:
                for _ in stream:
                    pass
            except grpc.RpcError as exc:
                ended.append(f"{address} {exc.code().name} {exc.details()}")
        threading.Thread(target=drain, daemon=True).start()
    stop = threading.Event()

    def submit() -> None:  # proposals in flight when the leader stops
        spec = codec.job_spec_to_proto(JobSpec(name="busy", tasks=1, command=("sleep", "30"),
                                               resources=Resources(100, 1 << 20, 0)))
        while not stop.is_set():
            try:
                cluster.client.submit(spec)
            except Exception:  # noqa: BLE001 - the masters are going away
                time.sleep(0.05)
    submitters = [threading.Thread(target=submit, daemon=True) for _ in range(3)]
    for t in submitters:
        t.start()
    time.sleep(1.5)
    assert not ended, f"streams ended before the masters stopped: {ended}"
    for m in cluster.state["masters"]:
        os.kill(m["pid"], signal.SIGTERM)
    stop.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(ended) < 3 or any(local.is_alive(m["pid"])
                                                                 for m in cluster.state["masters"])):
        time.sleep(0.05)
    for channel in channels:
        channel.close()
    assert len(ended) == 3, ended
    assert all(" UNAVAILABLE " in e and "is stopping" in e for e in ended), ended
    for m in cluster.state["masters"]:
        assert not local.is_alive(m["pid"])
        log = (cluster.data_dir / "logs" / f"{m['id']}.log").read_text()
        assert "master stopping" in log, log[-2000:]
        assert "Traceback" not in log and "CancelledError" not in log, log[-4000:]
