"""Job secrets on a real cluster (TLS): the tasks get them, and nothing prints them or keeps them in the clear."""

import functools
import hashlib
import json

from synapse.client.master_client import MasterClient
from synapse.rpc import convert
from tests.support.cluster import add_user, archived_ids, history, synctl
from tests.support.helpers import wait_for
from tests.support.http import fetch

SECRET = "sk-live-7d1e0c55aa90b3f4"
TOKEN = "tok-91c4e2d0b6"
ENV_VALUE = "env-value-b7a03e"


def test_a_jobs_secrets_reach_its_tasks_and_nothing_shows_them(make_cluster, tmp_path, monkeypatch):
    cluster = make_cluster(masters=3, workers=1)
    (tmp_path / "api-key").write_text(SECRET + "\n")
    out = tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(f"""
name: sealed
resources: {{cpu: 100m, memory: 64Mi}}
env: {{MODE: {ENV_VALUE}}}
secrets: {{API_KEY: file:./api-key, TOKEN: env:MY_TOKEN}}
command: [sh, -c, 'printf %s "$API_KEY" | sha256sum; printf %s "$API_KEY" >{out}/key; printf %s "$TOKEN" >{out}/token']
""")
    monkeypatch.setenv("MY_TOKEN", TOKEN)  # the submitting shell's variable
    submitted = synctl(cluster, "submit", str(job), "-o", "json")
    assert submitted.exit_code == 0, submitted.output
    job_id = json.loads(submitted.output)["id"]
    wait_for(lambda: cluster.client.get_job(job_id).status == "SUCCEEDED", 30, "the job to succeed")
    assert (out / "key").read_text() == SECRET and (out / "token").read_text() == TOKEN
    log = synctl(cluster, "logs", job_id)
    assert hashlib.sha256(SECRET.encode()).hexdigest() in log.output
    wait_for(lambda: job_id in archived_ids(cluster), 30, "the job in the history store")

    described = synctl(cluster, "describe", "job", job_id)
    assert described.exit_code == 0 and "Secrets:    API_KEY, TOKEN" in described.output, described.output
    as_json = synctl(cluster, "get", "jobs", "-o", "json")
    assert json.loads(as_json.output)[0]["secrets"] == ["API_KEY", "TOKEN"]
    shown = [described.output, as_json.output, synctl(cluster, "get", "jobs", "-o", "yaml").output,
             synctl(cluster, "get", "events").output, synctl(cluster, "get", "events", "-o", "json").output,
             json.dumps(history(cluster)),
             str(cluster.client.get_job(job_id))]
    get = functools.partial(fetch, ca=cluster.state["ca"])
    for m in cluster.state["masters"]:
        for page in (f"/jobs/{job_id}", "/jobs", "/history"):
            status, _, body = get(m["http_address"], page, cluster.token)
            assert status == 200, (page, status)
            shown.append(body)
    assert all(SECRET not in text and TOKEN not in text for text in shown)
    # On disk: the masters' journals, dumps and logs, the history store (the worker's own files hold
    # the task's environment and its log; tests/cluster/test_file_modes.py holds them private).
    masters = [p for d in (cluster.data_dir / "masters").iterdir() for p in d.rglob("*") if p.is_file()]
    files = [*masters, *(cluster.data_dir / "logs").glob("m*.log"), *cluster.data_dir.glob("history.sqlite*")]
    assert any(p.name == "raft.journal" for p in files)
    leaked = [str(p) for p in files if SECRET.encode() in p.read_bytes() or TOKEN.encode() in p.read_bytes()]
    assert not leaked, leaked

    # env values: the owner (here the admin) sees them; another user sees the names alone.
    bob = add_user(cluster, "bob")["token"]
    with MasterClient(cluster.addresses, bob, tls=cluster.tls) as client:
        assert dict(client.get_job(job_id).spec.env) == {"MODE": convert.HIDDEN_VALUE}
    assert dict(cluster.client.get_job(job_id).spec.env) == {"MODE": ENV_VALUE}
