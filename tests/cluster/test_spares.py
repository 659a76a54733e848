"""Spares on a real local cluster: a gang that loses a node restarts on its rack's spare (the core's
designation, restart order, reservations and eviction are in tests/unit/test_spares.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.core.model import NodeStatus
from tests.support.helpers import wait_for

GUEST_JOB = """\
name: guest
tasks: 1
resources: {{cpu: 1, memory: 64Mi, gpu: 8}}
time_limit: 10m
checkpoint: {{signal: USR1, notice: 2s}}
command:
  - sh
  - -c
  - |
    trap 'touch "{out}/noticed-$SYNAPSE_ATTEMPT"' USR1
    trap 'exit 143' TERM
    while :; do sleep 0.1; done
"""


def _kill_machine(cluster, worker_id: str) -> None:
    """kill -9 the worker agent and its tasks, as a machine dies."""
    cluster.kill_worker(worker_id, with_tasks=True)


@pytest.mark.slow
def test_a_gang_that_loses_a_node_restarts_on_its_racks_spare_on_a_real_cluster(make_cluster, tmp_path):
    """One rack of 4 workers with a spare: `get nodes` shows it; a job with a time limit backfills
    it; a 3-task gang loses a worker (kill -9) and restarts on the spare, the guest evicted with its
    checkpoint notice and requeued uncharged."""
    cluster = make_cluster(masters=1, workers=4, racks=1, spares_per_rack=1)
    client = cluster.client
    out = tmp_path / "out"
    out.mkdir()

    def synctl_ok(*args: str) -> str:
        result = CliRunner().invoke(synctl, ["--timeout", "15", *args], env=cluster.env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    spare = wait_for(lambda: next((n.id for n in client.list_nodes() if n.spare), None), what="a spare designated")
    listed = json.loads(synctl_ok("get", "nodes", "-o", "json"))
    assert [n["id"] for n in listed if n["spare"]] == [spare]
    assert any(line.startswith(spare) and "yes, spare" in line for line in synctl_ok("get", "nodes").splitlines())

    gang_file = tmp_path / "gang.yaml"
    gang_file.write_text("name: gang\ntasks: 3\nresources: {cpu: 1, memory: 64Mi, gpu: 8}\n"
                         "command: [sleep, '600']\n")
    gang = synctl_ok("submit", str(gang_file)).strip()
    first = wait_for(lambda: (j := client.get_job(gang)).status == "RUNNING" and j, what="the gang to run")
    assert spare not in {t.node_id for t in first.tasks}
    guest_file = tmp_path / "guest.yaml"
    guest_file.write_text(GUEST_JOB.format(out=out))
    guest = synctl_ok("submit", str(guest_file)).strip()
    placed = wait_for(lambda: (j := client.get_job(guest)).status == "RUNNING" and j, what="the guest to run")
    assert [t.node_id for t in placed.tasks] == [spare]

    lost = first.tasks[0].node_id
    _kill_machine(cluster, lost)
    again = wait_for(lambda: (j := client.get_job(gang)).status == "RUNNING" and j.attempt > first.attempt and j,
                     what="the gang to run again", timeout=90)
    nodes = {t.node_id for t in again.tasks}
    assert spare in nodes and lost not in nodes, (spare, lost, nodes)
    assert again.restarts_used == 0
    evicted = client.get_job(guest)
    assert evicted.attempt == 2 and evicted.restarts_used == 0, evicted
    assert any(e.kind == "Preempted" and f"by job {gang}" in e.message and "rule spare" in e.message
               for e in evicted.events), [(e.kind, e.message) for e in evicted.events]
    assert (out / "noticed-1").exists()  # its checkpoint notice came before the stop
    lost_node = next(n for n in client.list_nodes() if n.id == lost)
    assert lost_node.status == NodeStatus.DOWN.value and not lost_node.spare
    synctl_ok("cancel", gang)
    synctl_ok("cancel", guest)
