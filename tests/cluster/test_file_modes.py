"""Everything under a master's or a worker's data dir is its user's alone, whoever starts it; a task's
own files keep the umask its worker was started with."""

import os
import stat
from pathlib import Path

from synapse.common.datadir import make_private
from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from tests.support.cluster import archived_ids
from tests.support.helpers import wait_for

MARKER = "env-value-3f9c2e71"


def shared(root: Path) -> list[str]:
    """Every file or directory under `root` that its group or others may read, write or enter."""
    out = []
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
            out.append(f"{path.relative_to(root.parent)} {stat.S_IMODE(mode):04o}")
    return out


def test_every_file_of_a_cluster_is_private_and_a_task_keeps_its_umask(make_cluster, tmp_path):
    cluster = make_cluster(masters=3, workers=1)
    umask = os.umask(0o022)
    os.umask(umask)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    spec = JobSpec(name="modes", tasks=1, resources=Resources(100, 64 << 20, 0), env=(("API_KEY", MARKER),),
                   command=("sh", "-c", f'echo "$API_KEY"; echo "$API_KEY" > {out}/made; echo own > own-file'))
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec))
    wait_for(lambda: cluster.client.get_job(job_id).status == "SUCCEEDED", 30, "the job to succeed")
    wait_for(lambda: job_id in archived_ids(cluster), 30, "the job in the history store")
    # The task's own file outside the data dir: the umask its worker was started with, not 077.
    assert stat.S_IMODE((out / "made").stat().st_mode) == 0o666 & ~umask
    roots = [*(cluster.data_dir / "masters").iterdir(), *(cluster.data_dir / "workers").iterdir()]
    stores = sorted(cluster.data_dir.glob("history.sqlite*"))
    assert roots and stores
    found = []
    for root in roots:
        found += [p for p in root.rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]
    assert found, "the env value is on disk somewhere (the journal, the task's log): the modes must guard it"
    problems = [line for root in roots for line in shared(root)] + [line for s in stores for line in shared(s)]
    # The task's own file in its working directory is the task's business (its owner's umask)...
    problems = [line for line in problems if not line.split()[0].endswith("/own-file")]
    assert not problems, problems
    # ...and behind the worker's 0700 directories all the same.
    assert stat.S_IMODE(cluster.data_dir.stat().st_mode) == 0o700


def test_an_earlier_releases_data_dir_is_shut_at_start(tmp_path):
    data = tmp_path / "m1"
    (data / "sub").mkdir(parents=True)
    (data / "raft.journal").write_text("x")
    (data / "sub" / "task-output").write_text("x")
    for path, mode in ((data, 0o755), (data / "sub", 0o755), (data / "raft.journal", 0o644),
                       (data / "sub" / "task-output", 0o644)):
        path.chmod(mode)
    (data / "link").symlink_to("/etc/hostname")
    make_private(data)
    assert shared(data) == ["m1/sub/task-output 0644"]  # below the top, a 0700 directory guards it
    assert stat.S_IMODE(Path("/etc/hostname").stat().st_mode) & 0o044  # a link's target is left alone
    make_private(tmp_path / "new" / "w1")
    assert stat.S_IMODE((tmp_path / "new" / "w1").stat().st_mode) == 0o700
