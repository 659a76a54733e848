"""The checkpoint notice on a real cluster: a drained gang and a time-limited one get their signal
before they stop (the pure core's part is in tests/unit/test_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from tests.support.helpers import wait_for

#: Each task writes when it got the notice and when SIGTERM, and what its environment said of the
#: attempt before it (files named by attempt and rank under $OUT).
NOTICED_JOB = """\
name: {name}
tasks: 2
resources: {{cpu: 1, memory: 64Mi, gpu: 8}}
max_restarts: 0
{extra}checkpoint: {{signal: USR1, notice: 3s}}
env: {{OUT: "{out}"}}
command:
  - sh
  - -c
  - |
    at() {{ date +%s.%N > "$OUT/$1-$SYNAPSE_ATTEMPT-$RANK"; }}
    trap 'at noticed' USR1
    trap 'at term; exit 143' TERM
    echo "reason=$SYNAPSE_RESTART_REASON signal=$SYNAPSE_CHECKPOINT_SIGNAL" > "$OUT/env-$SYNAPSE_ATTEMPT-$RANK"
    while :; do sleep 0.1; done
"""


def stamp(out: Path, what: str, attempt: int, rank: int) -> float:
    return float((out / f"{what}-{attempt}-{rank}").read_text())


@pytest.mark.slow
def test_a_drained_gang_and_a_time_limited_one_get_their_notice_on_a_real_cluster(make_cluster, tmp_path):
    """A 2-task job with `checkpoint: {signal: USR1, notice: 3s}`, drained: each task writes its
    file on USR1 three seconds before its SIGTERM, the job requeues uncharged, and the next
    attempt's environment says SYNAPSE_RESTART_REASON=Drained. A time-limited one gets its notice
    3 s before its limit, and SIGTERM at the limit. A queue whose max_grace is shorter caps the
    notice, and submit says so."""
    cluster = make_cluster(workers=3, racks=1)
    out = tmp_path / "out"
    out.mkdir()

    def synctl_ok(*args: str):
        result = CliRunner().invoke(synctl, ["--timeout", "15", *args], env=cluster.env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result

    def job_file(name: str, extra: str = "") -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(NOTICED_JOB.format(name=name, extra=extra, out=out))
        return str(path)

    def running(job_id: str, attempt: int):
        job = cluster.client.get_job(job_id)
        return job if job.status == "RUNNING" and job.attempt == attempt else None

    # Drained: notice, 3 s, SIGTERM; requeued uncharged; attempt 2 learns why.
    drained = synctl_ok("submit", job_file("drained")).stdout.strip()
    first = wait_for(lambda: running(drained, 1), what="attempt 1 to run")
    wait_for(lambda: all((out / f"env-1-{r}").exists() for r in (0, 1)), what="attempt 1's tasks to trap USR1")
    assert {(out / f"env-1-{r}").read_text() for r in (0, 1)} == {"reason= signal=USR1\n"}
    synctl_ok("drain", first.tasks[0].node_id)
    second = wait_for(lambda: running(drained, 2), what="attempt 2 to run after the drain")
    for rank in (0, 1):
        noticed, term = stamp(out, "noticed", 1, rank), stamp(out, "term", 1, rank)
        assert 2.9 <= term - noticed <= 4.5, (rank, noticed, term)  # the file, written 3 s before SIGTERM
    assert (second.restarts_used, second.requeues) == (0, 1)
    events = [(e.kind, e.message) for e in second.events]
    requeued = [m for k, m in events if k == "Requeued"]
    assert len(requeued) == 1 and requeued[0].startswith(f"attempt 2 after node {first.tasks[0].node_id} drained") \
        and requeued[0].endswith("; not charged to max_restarts"), events
    assert [m.split(";")[0] for k, m in events if k == "Notice"] == ["SIGUSR1 to 2 task(s)"], events
    wait_for(lambda: all((out / f"env-2-{r}").exists() for r in (0, 1)), what="attempt 2's tasks to start")
    assert {(out / f"env-2-{r}").read_text() for r in (0, 1)} == {"reason=Drained signal=USR1\n"}
    described = synctl_ok("describe", "job", drained).stdout
    assert "Checkpoint: SIGUSR1 3s before a planned stop" in described
    assert "Notice     SIGUSR1 to 2 task(s); the drain stops them at " in described, described
    synctl_ok("cancel", drained)  # not planned: no notice for attempt 2
    wait_for(lambda: cluster.client.get_job(drained).status == "CANCELLED", what="the cancel")
    assert not (out / "noticed-2-0").exists() and (out / "term-2-0").exists()

    # Time-limited: the notice 3 s before the limit, SIGTERM at the limit.
    limited = synctl_ok("submit", job_file("limited", extra="time_limit: 8s\n")).stdout.strip()
    done = wait_for(lambda: (j := cluster.client.get_job(limited)).status in ("FAILED", "SUCCEEDED") and j,
                    what="the time limit", timeout=60)
    assert done.status == "FAILED" and {t.reason for t in done.tasks} == {"TimeLimit"}, done
    notice = next(e for e in done.events if e.kind == "Notice")
    assert "its time limit stops them at" in notice.message
    assert 5.0 <= notice.at - done.started_at <= 6.5, (notice.at, done.started_at)  # limit 8 s - notice 3 s
    for rank in (0, 1):
        noticed, term = stamp(out, "noticed", 1, rank), stamp(out, "term", 1, rank)
        assert 2.9 <= term - noticed <= 4.5, (rank, noticed, term)
        assert 7.9 <= term - done.started_at <= 10.0, (rank, term, done.started_at)

    # A queue whose max_grace is shorter than the notice caps it, and submit says so.
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: brief\n    preemption: {max_grace: 2s}\n")
    synctl_ok("apply", str(queues))
    capped = synctl_ok("submit", job_file("capped", extra="queue: brief\n"))
    assert ("synctl: warning: checkpoint.notice 3s is longer than queue brief's max_grace of 2s: the tasks get 2s "
            "of notice\n") in capped.stderr, capped.stderr
    synctl_ok("cancel", capped.stdout.strip())
