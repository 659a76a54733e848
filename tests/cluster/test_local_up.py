"""synapse-local's `up` and `down` as a user runs them: `up` again over a stopped cluster starts
that same cluster (a gang runs), other settings are refused with exit 2 and how to start afresh,
`--fresh` and `down --purge` start anew; `--allow-mount` reaches the workers; a worker that is not
READY fails `up`. The rendezvous port range as a setting of the cluster file and the worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.master_client import ClientError, MasterClient
from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.local import cluster as local
from synapse.local.main import main as synapse_local
from tests.support.helpers import wait_for


def _up(data_dir: Path, base: int, *args: str):
    return CliRunner().invoke(synapse_local, ["up", "--data-dir", str(data_dir), "--base-port", str(base),
                                              "--gpus-per-worker", "1", "--heartbeat", "0.5", *args])


def _down(data_dir: Path, *args: str):
    return CliRunner().invoke(synapse_local, ["down", "--data-dir", str(data_dir), *args])


def _client(data_dir: Path) -> MasterClient:
    state = local.load_state(data_dir.resolve())
    return MasterClient([m["api_address"] for m in state["masters"]], state["token"], deadline=30,
                        tls=local.client_tls(state))


def _gang(client: MasterClient, name: str) -> str:
    job = JobSpec(name=name, tasks=2, resources=Resources(500, 1 << 28, 1), command=("sh", "-c", "echo rank $RANK"))
    return client.submit(codec.job_spec_to_proto(job))


def _ended(client: MasterClient, job_id: str, timeout: float = 40.0) -> str:
    return wait_for(lambda: (lambda s: s if s in ("SUCCEEDED", "FAILED", "CANCELLED") else None)(
        client.get_job(job_id).status), timeout, f"job {job_id} to end")


@pytest.mark.slow
def test_up_down_up_restarts_the_same_cluster_and_a_gang_succeeds(tmp_path):
    data_dir, base = tmp_path / "c", local.free_base_port(3)
    shape = ("--workers", "2", "--racks", "1")
    try:
        first = _up(data_dir, base, *shape)
        assert first.exit_code == 0, first.output
        client = _client(data_dir)
        before = _gang(client, "before")
        assert _ended(client, before) == "SUCCEEDED"
        token = local.load_state(data_dir)["token"]
        client.close()
        assert _down(data_dir).exit_code == 0

        again = _up(data_dir, base, *shape)
        assert again.exit_code == 0, again.output
        assert "local cluster up again, as it was" in again.output
        assert local.load_state(data_dir)["token"] == token  # the same cluster, not a new one
        client = _client(data_dir)
        assert sorted((n.id, n.status) for n in client.list_nodes()) == [("w1", "READY"), ("w2", "READY")]
        assert client.get_job(before).status == "SUCCEEDED"  # its journals came back
        assert _ended(client, _gang(client, "after")) == "SUCCEEDED"  # its workers registered again
        client.close()
        assert _down(data_dir).exit_code == 0

        # `up` with no options at all starts it as it was, too (the recorded settings, not the defaults)
        bare = CliRunner().invoke(synapse_local, ["up", "--data-dir", str(data_dir)])
        assert bare.exit_code == 0, bare.output
        assert len(local.load_state(data_dir)["workers"]) == 2
        assert _down(data_dir).exit_code == 0

        refused = _up(data_dir, base, "--workers", "3", "--racks", "1")
        assert refused.exit_code == 2, refused.output
        assert "--workers: it has 2, asked 3" in refused.output
        assert "synapse-local up --fresh" in refused.output and "synapse-local down --purge" in refused.output
        assert not any(local.is_alive(p) for p in local._pids(local.load_state(data_dir)))  # nothing started

        fresh = _up(data_dir, base, "--workers", "1", "--racks", "1", "--fresh")
        assert fresh.exit_code == 0, fresh.output
        client = _client(data_dir)
        assert [n.id for n in client.list_nodes()] == ["w1"]
        with pytest.raises(ClientError):
            client.get_job(before)  # a new cluster: the old one's jobs are gone
        client.close()
    finally:
        if (data_dir / "cluster.json").exists():
            local.down(data_dir)
    purged = _down(data_dir, "--purge")
    assert purged.exit_code == 0, purged.output
    assert not data_dir.exists()  # it held nothing but the cluster


def test_a_data_dir_whose_cluster_cannot_be_restarted_is_refused_with_how_to_start_afresh(tmp_path):
    data_dir = tmp_path / "c"
    (data_dir / "masters" / "m1").mkdir(parents=True)  # journals, but no cluster file: an earlier run cut short
    result = _up(data_dir, local.free_base_port(3))
    assert result.exit_code == 2, result.output
    assert "cluster.json, cluster.yaml, secrets/token missing" in result.output
    assert "--fresh" in result.output
    (data_dir / "own-notes.txt").write_text("not the cluster's\n")
    assert _down(data_dir, "--purge").exit_code == 0
    assert sorted(p.name for p in data_dir.iterdir()) == ["own-notes.txt"]  # purge removes the cluster's only


def test_a_worker_that_never_becomes_ready_fails_up_naming_it(tmp_path, monkeypatch):
    data_dir = tmp_path / "c"
    real = local.worker_argv

    def refused(*args, **kw):  # w2 presents another node's certificate: the masters refuse it
        argv = real(*args, **kw)
        if args[3] == "w2":
            argv[argv.index("--cert") + 1] = argv[argv.index("--cert") + 1].replace("w2", "w1")
            argv[argv.index("--key") + 1] = argv[argv.index("--key") + 1].replace("w2", "w1")
        return argv

    monkeypatch.setattr(local, "worker_argv", refused)
    result = _up(data_dir, local.free_base_port(3), "--masters", "1", "--workers", "2", "--racks", "1")
    assert result.exit_code == 1, result.output
    assert "the local cluster did not come up: worker(s) w2 exited" in result.output
    assert not any(local.is_alive(p) for p in local._pids(local.load_state(data_dir)))  # it stopped what it started


@pytest.mark.slow
def test_allow_mount_lets_a_job_in_an_image_mount_from_under_the_prefix(make_cluster, tmp_path):
    from tests.support import images as s
    from tests.support.images import finished, needs_root_fs, submit, task_logs
    if needs_root_fs.args[0]:
        pytest.skip("needs busybox and namespaces")
    data = tmp_path / "data"
    (data / "set").mkdir(parents=True)
    (data / "set" / "in.txt").write_text("shared dataset\n")
    layout = s.write_layout(tmp_path / "layout", {"1": s.busybox_image()})
    cluster = make_cluster(masters=1, workers=1, racks=1, allow_mounts=(str(data),))
    job = ("name: {name}\ntasks: 1\nresources: {{cpu: 1}}\nimage: oci:" + str(layout) + ":1\n"
           "mounts: [{{source: {source}, target: /mnt/data, readonly: true}}]\ncommand: [cat, /mnt/data/in.txt]\n")
    inside = submit(cluster, job.format(name="inside", source=data / "set"))
    assert finished(cluster, inside).status == "SUCCEEDED", cluster.client.get_job(inside)
    assert "shared dataset" in task_logs(cluster, inside)[0]
    outside = submit(cluster, job.format(name="outside", source=tmp_path / "layout"))
    assert finished(cluster, outside).status == "FAILED"  # not under the prefix: the worker refuses it


# ---- the rendezvous port range ------------------------------------------------------------------


def _worker(tmp_path: Path, *args: str, timeout: float) -> tuple[int | None, str]:
    """Run a worker whose masters never answer, for `timeout` seconds at most: (exit code or None, stderr)."""
    argv = [sys.executable, "-m", "synapse.worker", "--masters", "127.0.0.1:1", "--token", "t", "--gpus", "0",
            "--cpus", "1", "--memory", "1Gi", "--isolation", "none", "--data-dir", str(tmp_path / "w"), *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # still trying to register: killed, its output kept
        return None, (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    return done.returncode, done.stderr


def test_the_worker_refuses_a_bad_rendezvous_range_and_warns_of_an_overlap_with_its_own(tmp_path):
    code, err = _worker(tmp_path, "--rendezvous-ports", "7-8", timeout=60)
    assert code == 2 and "--rendezvous-ports 7-8: ports from 1024 to 65535" in err, err
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    if low < 1024 + 200:
        pytest.skip(f"this machine's ephemeral range starts at {low}")
    inside = f"{low - 100}-{low + 99}"  # reaches 100 ports into this node's ephemeral range
    _, err = _worker(tmp_path, "--rendezvous-ports", inside, timeout=8)
    assert f"overlap={low}-{min(high, low + 99)}" in err, err
    _, err = _worker(tmp_path, "--rendezvous-ports", f"{low - 300}-{low - 1}", timeout=8)
    assert "ephemeral ports overlap rendezvous ports" not in err, err


