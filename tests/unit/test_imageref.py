"""Image references: every accepted form parses to its parts and back, and every bad one is refused
with a reason naming the part (synapse.core.jobs.imageref); a job's `image` is checked the same way."""

from __future__ import annotations

import pytest

from synapse.core.jobs import imageref
from synapse.core.jobs.imageref import ImageRef, ImageRefError
from synapse.core.jobs.jobspec import JobFileError, parse_job

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, want, canonical", [
    ("registry.example:5000/team/train:1.4",
     ImageRef("docker", "registry.example:5000", "team/train", "1.4"), None),
    (f"127.0.0.1:5000/team/train@{D}", ImageRef("docker", "127.0.0.1:5000", "team/train", "", D), None),
    (f"127.0.0.1:5000/train:v2@{D}", ImageRef("docker", "127.0.0.1:5000", "train", "v2", D), None),
    ("docker://localhost:5000/a/b/c", ImageRef("docker", "localhost:5000", "a/b/c", "latest"),
     "localhost:5000/a/b/c:latest"),
    ("localhost/x", ImageRef("docker", "localhost", "x", "latest"), "localhost/x:latest"),
    ("team/train", ImageRef("docker", "docker.io", "team/train", "latest"), "docker.io/team/train:latest"),
    ("ubuntu:22.04", ImageRef("docker", "docker.io", "library/ubuntu", "22.04"), "docker.io/library/ubuntu:22.04"),
    ("reg.example/a__b/c-d.e_f:T_1.x-y", ImageRef("docker", "reg.example", "a__b/c-d.e_f", "T_1.x-y"), None),
    ("[::1]:5000/x:1", ImageRef("docker", "[::1]:5000", "x", "1"), None),
    ("oci:/shared/images/train:1.4", ImageRef("oci", tag="1.4", path="/shared/images/train"), None),
    ("oci:/shared/images/train", ImageRef("oci", path="/shared/images/train"), None),
    ("oci-archive:/data/train.tar", ImageRef("oci-archive", path="/data/train.tar"), None),
    ("oci-archive:/data/train.tar:v1", ImageRef("oci-archive", tag="v1", path="/data/train.tar"), None),
    ("dir:/scratch/rootfs/", ImageRef("dir", path="/scratch/rootfs"), "dir:/scratch/rootfs"),
])
def test_good_references_parse_to_their_parts(text, want, canonical):
    got = imageref.parse(text)
    assert got == want
    assert str(got) == (canonical or text)
    assert imageref.parse(str(got)) == got  # the canonical text parses back to the same reference


@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    (" reg.example/x", "spaces"),
    ("reg.example/x y", "spaces"),
    ("reg.example/x\n", "control"),
    ("reg.example/Team/x", "repository component 'Team'"),
    ("reg.example//x", "empty component"),
    ("reg.example/x/", "empty component"),
    ("reg.example:5000/", "empty component"),
    ("reg.example/x:", "tag ''"),
    ("reg.example/x:-bad", "tag '-bad'"),
    ("reg.example/x:" + "t" * 129, "tag"),
    ("reg.example/x@sha256:abc", "digest"),
    ("reg.example/x@md5:" + "a" * 32, "digest"),
    (f"reg.example/x@sha256:{'A' * 64}", "digest"),
    ("reg.example:99999/x", "port 99999"),
    ("bad_host.example/x", "registry host"),
    ("reg.example/../x", "repository component '..'"),
    ("reg.example/x/" + "a" * 260, "longer than 255"),
    ("x" * 1100, "longer than 1024"),
    ("docker-archive:/x.tar", "unknown transport"),
    ("https://reg.example/x", "unknown transport"),
    ("oci:relative/dir", "absolute"),
    ("oci:", "needs a path"),
    ("oci:/a/../b", "'..'"),
    ("oci:/a/./b", "'.'"),
    ("oci:/a//b", "empty component"),
    ("oci:/a/b$c", "only letters"),
    ("oci:/a/b:-x", "ref name"),
    ("oci:/", "may not be /"),
    ("oci-archive:x.tar", "absolute"),
    ("dir:/", "may not be /"),
    ("dir://", "empty component"),
    ("dir:rootfs", "absolute"),
    ("dir:/a/b:c", "may not contain ':'"),
    ("dir:/a/..", "'..'"),
])
def test_bad_references_are_refused_with_a_reason(text, reason):
    with pytest.raises(ImageRefError) as err:
        imageref.parse(text)
    assert reason in str(err.value)


def test_a_job_with_a_malformed_image_is_refused_naming_the_field():
    doc = {"name": "j", "tasks": 1, "resources": {"cpu": 1}, "command": ["true"]}
    assert parse_job({**doc, "image": "127.0.0.1:5000/team/train:1"}).image == "127.0.0.1:5000/team/train:1"
    assert parse_job({**doc, "image": "oci:/shared/images/train:1.4"}).image == "oci:/shared/images/train:1.4"
    with pytest.raises(JobFileError) as err:
        parse_job({**doc, "image": "oci:shared/train"})
    assert err.value.field == "image" and "absolute" in err.value.why
    with pytest.raises(JobFileError) as err:
        parse_job({**doc, "image": "Registry.example/Team/X"})
    assert err.value.field == "image" and "'Team'" in err.value.why


def test_synctl_submit_image_goes_through_the_same_check():
    from click.testing import CliRunner

    from synapse.client.cli.main import main
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", "--image", "oci:train", "--", "true"])
    assert out.exit_code == 2 and "invalid job: image: oci:train: the path must be absolute" in out.output, out.output
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", "--image", "oci:/srv/train:1", "--", "true"])
    assert out.exit_code == 3 and "cluster unreachable" in out.output  # accepted, built and sent
