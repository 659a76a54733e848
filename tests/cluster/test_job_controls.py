"""Hold, release, update, requeue and a queue's per-user limits on a real local cluster, through synctl."""

from __future__ import annotations

import json
import time

import pytest

from synapse.client.cli.exits import EXIT_DENIED
from tests.support.cluster import synctl_as as synctl
from tests.support.cluster import wait_status

QUEUES = """
queues:
  - name: research
    max_per_user: {gpu: 4, jobs: 3}
    interactive: {max_duration: 2h}
"""
JOB = ["--cpu", "1", "--mem", "256Mi", "--queue", "research"]


def describe(cl, token, job_id):
    out = synctl(cl, token, "describe", "job", job_id, "-o", "json")
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def submitted(out) -> str:
    assert out.exit_code == 0, out.output
    return out.output.strip()


@pytest.mark.slow
def test_hold_release_update_requeue_and_per_user_limits_through_synctl(make_cluster, tmp_path):
    cl = make_cluster(masters=1, workers=1, racks=1)
    admin = cl.token
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    assert synctl(cl, admin, "apply", str(path)).exit_code == 0
    queue = json.loads(synctl(cl, admin, "describe", "queue", "research", "-o", "json").output)
    assert queue["max_per_user"] == {"gpu": 4, "jobs": 3} and queue["interactive"] == {"max_duration_s": 7200.0}
    alice = json.loads(synctl(cl, admin, "user", "add", "alice", "-o", "json").output)["token"]
    bob = json.loads(synctl(cl, admin, "user", "add", "bob", "-o", "json").output)["token"]

    # submit --hold: queued, never placed, until its owner releases it
    held = submitted(synctl(cl, alice, "submit", "--hold", "--name", "held", "--gpu", "2", *JOB, "--", "sleep", "60"))
    time.sleep(1.0)  # several scheduling rounds
    job = describe(cl, alice, held)
    assert (job["status"], job["held_by"]) == ("PENDING", "alice") and not job["tasks"]
    assert "PENDING (held)" in synctl(cl, alice, "get", "jobs").output
    assert synctl(cl, bob, "release", held).exit_code == EXIT_DENIED  # not bob's
    out = synctl(cl, alice, "release", held)
    assert out.exit_code == 0 and "released" in out.output, out.output
    wait_status(cl.client, held, {"RUNNING"})
    out = synctl(cl, alice, "hold", held)
    assert out.exit_code == 2 and "only a pending job can be held" in out.output, out.output

    # update: the owner lowers and shortens, only an admin raises and lengthens
    assert synctl(cl, alice, "update", held, "--priority", "5").exit_code == EXIT_DENIED
    assert synctl(cl, alice, "update", held, "--priority", "-1", "--time-limit", "1h").exit_code == 0
    out = synctl(cl, alice, "update", held, "--time-limit", "2h")
    assert out.exit_code == EXIT_DENIED and "only an admin may lengthen" in out.output, out.output
    assert synctl(cl, admin, "update", held, "--time-limit", "2h", "--priority", "7").exit_code == 0
    job = describe(cl, alice, held)
    assert (job["priority"], job["time_limit_s"]) == (7, 7200.0)
    assert [e["kind"] for e in job["events"]].count("Updated") == 2

    # requeue: the gang stops and runs again, a new attempt, no restart used
    assert synctl(cl, alice, "requeue", held, "--reason", "test").exit_code == 0
    job = wait_status(cl.client, held, {"RUNNING"}, attempt=2)
    info = describe(cl, alice, held)
    assert (info["restarts_used"], info["requeues"]) == (0, 1)
    assert any(e["kind"] == "Requeued" and "requeued by alice: test" in e["message"] for e in info["events"])

    # max_per_user.gpu: alice holds 2 of her 4 GPUs; a 4-GPU job waits, naming the limit; bob's starts
    big = submitted(synctl(cl, alice, "submit", "--name", "big", "--gpu", "4", *JOB, "--", "sleep", "60"))
    bobs = submitted(synctl(cl, bob, "submit", "--name", "bobs", "--gpu", "4", *JOB, "--", "sleep", "60"))
    wait_status(cl.client, bobs, {"RUNNING"})
    deadline = time.monotonic() + 10
    while "user limit" not in (describe(cl, alice, big)["waiting"] or "") and time.monotonic() < deadline:
        time.sleep(0.1)
    job = describe(cl, alice, big)
    assert job["status"] == "PENDING" and job["waiting_code"] == "UserLimit"
    assert job["waiting"].startswith("user limit: 4 GPUs in queue research"), job["waiting"]

    # max_per_user.jobs: alice has 2 unfinished jobs there and the limit is 3: one more, then no more
    third = submitted(synctl(cl, alice, "submit", "--name", "third", "--gpu", "0", *JOB, "--", "true"))
    out = synctl(cl, alice, "submit", "--name", "fourth", "--gpu", "0", *JOB, "--", "true")
    assert out.exit_code == 2 and "refused: limit reached: queue research: user alice has 3" in out.output, out.output
    assert "max_per_user.jobs is 3" in out.output
    wait_status(cl.client, third, {"SUCCEEDED"})
    assert synctl(cl, alice, "submit", "--name", "fourth", "--gpu", "0", *JOB, "--", "true").exit_code == 0

    # an interactive job: its time limit defaults to the queue's maximum and may not exceed it
    session = tmp_path / "session.yaml"
    session.write_text("name: session\ninteractive: true\nqueue: research\ncommand: [sleep, '1']\n"
                       "resources: {cpu: 1, memory: 256Mi}\n")
    sid = submitted(synctl(cl, bob, "submit", str(session)))
    info = describe(cl, bob, sid)
    assert (info["type"], info["time_limit_s"]) == ("interactive", 7200.0)
    assert "interactive" in synctl(cl, bob, "get", "jobs").output
    session.write_text(session.read_text() + "time_limit: 3h\n")
    out = synctl(cl, bob, "submit", str(session))
    assert out.exit_code == 2 and "may run at most 2h00m in queue research" in out.output, out.output
    for job_id in (held, big, bobs):
        synctl(cl, admin, "cancel", job_id)
