"""Pulling from registries: the real registry from Debian (docker-registry, started per module on
a free loopback port) for the ordinary paths, Basic (htpasswd) and Bearer token auth, and one pull
for concurrent callers; a small broken registry in Python for what a real one would not do (wrong
digests, huge manifests, stalls, lies about sizes)."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from synapse.images.registry import RegistryClient, load_credentials
from synapse.images.store import ImageStore, PullError
from tests.support.helpers import wait_for
from tests.support.images import (
    E,
    FakeRegistry,
    Registry,
    busybox_image,
    free_port,
    make_image,
    make_index,
    make_layer,
    multiarch_index,
    registry_available,
)

pytestmark = pytest.mark.skipif(bool(registry_available()), reason=registry_available() or "-")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture
def fake():
    server = FakeRegistry()
    yield server
    server.close()


def test_pull_by_tag_by_digest_and_through_an_index_to_amd64(registry, tmp_path):
    index, amd, arm = multiarch_index()
    registry.push("team/multi", "1.0", index)
    digest = registry.push("team/bb", "1.4", busybox_image())
    store = ImageStore(tmp_path / "store")
    by_tag = store.ensure(f"{registry.host}/team/bb:1.4", holder="t0")
    assert by_tag.digest == digest and (by_tag.root / "bin" / "busybox").stat().st_size > 100_000
    by_digest = store.ensure(f"{registry.host}/team/bb@{digest}")
    assert by_digest.root == by_tag.root
    multi = store.ensure(f"{registry.host}/team/multi:1.0")
    assert multi.digest == amd.digest and (multi.root / "platform").read_text() == "amd64\n"
    assert store.ensure(f"{registry.host}/team/multi@{index.digest}").digest == amd.digest
    with pytest.raises(PullError) as err:
        store.ensure(f"{registry.host}/team/bb:missing")
    assert err.value.cause == "NOT_FOUND" and not err.value.node_side


def test_docker_v2_schema_2_manifests_and_manifest_lists(registry, tmp_path):
    amd = make_image([make_layer([E("platform", data=b"docker amd64\n")])], docker=True)
    arm = make_image([make_layer([E("platform", data=b"docker arm64\n")])], arch="arm64", docker=True)
    registry.push("team/docker", "1", make_index([(arm, "arm64"), (amd, "amd64")], docker=True))
    image = ImageStore(tmp_path / "store").ensure(f"{registry.host}/team/docker:1")
    assert image.digest == amd.digest and (image.root / "platform").read_text() == "docker amd64\n"
    manifest = registry.requests("GET", "/v2/team/docker/manifests/")
    assert manifest == ["/v2/team/docker/manifests/1", f"/v2/team/docker/manifests/{amd.digest}"]


def test_concurrent_ensures_of_one_image_pull_it_once(registry, tmp_path):
    img = make_image([make_layer([E(f"f{i}", data=bytes([i]) * 200_000)]) for i in range(3)])
    registry.push("team/once", "v1", img)
    store = ImageStore(tmp_path / "store")
    start = threading.Barrier(8)
    results, errors = [], []

    def ensure(n: int) -> None:
        start.wait()
        try:
            results.append(store.ensure(f"{registry.host}/team/once:v1", holder=f"task-{n}"))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=ensure, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len({r.root for r in results}) == 1 and len(results) == 8
    blob_gets = registry.requests("GET", "/v2/team/once/blobs/")
    assert sorted(blob_gets) == sorted(f"/v2/team/once/blobs/{d}" for d in img.blobs), blob_gets
    assert len(registry.requests("GET", "/v2/team/once/manifests/")) == 1
    assert set(store.cached()[0].holders) == {f"task-{n}" for n in range(8)}


def test_basic_auth_from_the_credentials_file(tmp_path):
    with Registry(tmp_path / "reg", auth=("htpasswd", {"trainer": "s3cret"})) as reg:
        reg.push("private/bb", "1", busybox_image())
        ref = f"{reg.host}/private/bb:1"
        with pytest.raises(PullError) as err:
            ImageStore(tmp_path / "anon").ensure(ref)
        assert err.value.cause == "UNAUTHORIZED" and "no credentials" in err.value.message
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps({"auths": {reg.host: {"username": "trainer", "password": "nope"}}}))
        with pytest.raises(PullError) as err:
            ImageStore(tmp_path / "wrong", credentials=wrong).ensure(ref)
        assert err.value.cause == "UNAUTHORIZED"
        right = tmp_path / "right.json"
        right.write_text(json.dumps({"auths": {reg.host: {"auth": base64.b64encode(b"trainer:s3cret").decode()}}}))
        assert ImageStore(tmp_path / "right", credentials=right).ensure(ref).root.is_dir()


def test_bearer_token_flow_with_the_registrys_own_token_auth(tmp_path):
    with Registry(tmp_path / "reg", auth=("token", {"trainer": "s3cret"})) as reg:
        reg.push("private/bb", "1", busybox_image())
        ref = f"{reg.host}/private/bb:1"
        with pytest.raises(PullError) as err:
            ImageStore(tmp_path / "anon").ensure(ref)  # an anonymous token grants nothing
        assert err.value.cause == "UNAUTHORIZED"
        creds = tmp_path / "creds.json"
        creds.write_text(json.dumps({"auths": {reg.host: {"username": "trainer", "password": "bad"}}}))
        with pytest.raises(PullError) as err:
            ImageStore(tmp_path / "bad", credentials=creds).ensure(ref)
        assert err.value.cause == "UNAUTHORIZED" and "token service" in err.value.message
        creds.write_text(json.dumps({"auths": {reg.host: {"username": "trainer", "password": "s3cret"}}}))
        issued = len(reg.issuer.requests)
        image = ImageStore(tmp_path / "ok", credentials=creds).ensure(ref)
        assert (image.root / "etc" / "hostname").read_text() == "image\n"
        assert "scope=repository%3Aprivate%2Fbb%3Apull" in reg.issuer.requests[issued]
        assert len(reg.issuer.requests) == issued + 1  # one token serves the manifest and every blob


def test_a_blob_that_does_not_match_its_digest_is_refused_and_never_unpacked(fake, tmp_path):
    img = busybox_image()
    fake.serve_image("team/bad", "1", img)
    layer = json.loads(img.manifest)["layers"][0]
    tampered = bytearray(img.blobs[layer["digest"]])
    tampered[1000] ^= 0xFF
    fake.serve(f"/v2/team/bad/blobs/{layer['digest']}", bytes(tampered))
    store = ImageStore(tmp_path / "store", retries=0)
    with pytest.raises(PullError) as err:
        store.ensure(f"{fake.host}/team/bad:1")
    assert err.value.cause == "DIGEST_MISMATCH" and layer["digest"] in err.value.message
    assert list((tmp_path / "store" / "images").iterdir()) == [] and store.cached() == []
    # A manifest fetched by digest must hash to it.
    other = make_image([make_layer([E("x", data=b"x")])])
    fake.serve(f"/v2/team/bad/manifests/{img.digest}", other.manifest, other.media_type)
    with pytest.raises(PullError) as err:
        store.ensure(f"{fake.host}/team/bad@{img.digest}")
    assert err.value.cause == "DIGEST_MISMATCH"


def test_a_blob_longer_than_its_descriptor_is_refused(fake, tmp_path):
    img = busybox_image()
    fake.serve_image("team/long", "1", img)
    layer = json.loads(img.manifest)["layers"][0]["digest"]
    fake.serve(f"/v2/team/long/blobs/{layer}", img.blobs[layer] + b"\0" * 10)
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "store", retries=0).ensure(f"{fake.host}/team/long:1")
    assert err.value.cause == "TOO_LARGE" and "longer than" in err.value.message


def test_a_huge_manifest_is_refused_without_reading_it(fake, tmp_path):
    def announced(h) -> None:  # says 100 MB up front
        h.send_response(200)
        h.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        h.send_header("Content-Length", str(100 << 20))
        h.end_headers()
        h.wfile.write(b"{" + b" " * 65536)

    def streamed(h) -> None:  # says nothing, streams 100 MB of one small buffer
        h.send_response(200)
        h.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        h.send_header("Connection", "close")
        h.end_headers()
        chunk = b" " * 65536
        for _ in range(1600):
            h.wfile.write(chunk)
        h.close_connection = True

    fake.routes["/v2/team/big/manifests/announced"] = announced
    fake.routes["/v2/team/big/manifests/streamed"] = streamed
    store = ImageStore(tmp_path / "store", retries=0)
    for tag in ("announced", "streamed"):
        with pytest.raises(PullError) as err:
            store.ensure(f"{fake.host}/team/big:{tag}")
        assert err.value.cause == "TOO_LARGE" and "limit" in err.value.message


def test_a_registry_that_stalls_mid_layer_times_out(fake, tmp_path):
    img = busybox_image()
    fake.serve_image("team/slow", "1", img)
    layer = json.loads(img.manifest)["layers"][0]["digest"]
    blob = img.blobs[layer]

    def stall(h) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(blob)))
        h.end_headers()
        h.wfile.write(blob[: len(blob) // 2])
        h.wfile.flush()
        fake.release.wait(60)
        h.close_connection = True  # released: end the response short

    fake.routes[f"/v2/team/slow/blobs/{layer}"] = stall
    store = ImageStore(tmp_path / "store", timeout=1.0, retries=1)
    started = time.monotonic()
    with pytest.raises(PullError) as err:
        store.ensure(f"{fake.host}/team/slow:1")
    assert err.value.cause == "TIMEOUT" and err.value.node_side
    assert time.monotonic() - started < 15 and fake.hits[f"/v2/team/slow/blobs/{layer}"] == 2  # one retry
    assert list((tmp_path / "store" / "tmp").iterdir()) == []
    # A deadline bounds the whole pull, retries included.
    started = time.monotonic()
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "s2", timeout=30, retries=5).ensure(f"{fake.host}/team/slow:1",
                                                                  deadline=time.monotonic() + 1.5)
    assert err.value.cause == "TIMEOUT" and time.monotonic() - started < 10
    # A caller waiting for another caller's pull of the same image gives up at its own deadline.
    store = ImageStore(tmp_path / "s3", timeout=30, retries=0)
    first = threading.Thread(target=lambda: pytest.raises(PullError, store.ensure, f"{fake.host}/team/slow:1"))
    first.start()
    wait_for(lambda: fake.hits[f"/v2/team/slow/blobs/{layer}"] >= 4, 30, "the first pull to stall")
    started = time.monotonic()
    with pytest.raises(PullError) as err:
        store.ensure(f"{fake.host}/team/slow:1", deadline=time.monotonic() + 1)
    assert err.value.cause == "TIMEOUT" and "another pull" in err.value.message and time.monotonic() - started < 10
    fake.release.set()
    first.join(60)


def test_server_errors_are_retried_then_unreachable_and_a_closed_port_is_unreachable(fake, tmp_path):
    def broken(h) -> None:
        h.send_response(503)
        h.send_header("Content-Length", "0")
        h.end_headers()

    fake.routes["/v2/team/down/manifests/1"] = broken
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "a", retries=2).ensure(f"{fake.host}/team/down:1")
    assert err.value.cause == "UNREACHABLE" and err.value.node_side and fake.hits["/v2/team/down/manifests/1"] == 3
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "b", retries=0).ensure(f"127.0.0.1:{free_port()}/team/x:1")
    assert err.value.cause == "UNREACHABLE"


def test_plain_http_only_for_loopback_and_listed_insecure_registries(tmp_path):
    assert RegistryClient("127.0.0.1:5000").plain and RegistryClient("localhost:5000").plain
    assert RegistryClient("[::1]:5000").plain
    assert not RegistryClient("registry.example:5000").plain
    assert RegistryClient("registry.example:5000", insecure=["registry.example:5000"]).plain
    assert RegistryClient("registry.example", insecure=["registry.example"]).plain
    assert RegistryClient("docker.io").endpoint == "registry-1.docker.io"


def test_the_credentials_file_format(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"auths": {"https://reg.example:5000/v2/": {"auth": base64.b64encode(b"u:p:q").decode()},
                                          "other.example": {"username": "a", "password": "b"}}}))
    assert load_credentials(path) == {"reg.example:5000": ("u", "p:q"), "other.example": ("a", "b")}
    path.write_text(json.dumps({"auths": {"r": {"auth": "bm90LWEtcGFpcg=="}}}))
    with pytest.raises(ValueError, match="not base64 of user:password"):
        load_credentials(path)


def test_credentials_never_go_over_plain_http_to_a_host_not_allowed_it(fake, tmp_path):
    def challenge(h) -> None:
        h.send_response(401)
        h.send_header("WWW-Authenticate", 'Bearer realm="http://auth.example/token",service="s"')
        h.send_header("Content-Length", "0")
        h.end_headers()

    def redirect(h) -> None:
        h.send_response(307)
        h.send_header("Location", "http://cdn.example/blob")
        h.send_header("Content-Length", "0")
        h.end_headers()

    fake.routes["/v2/team/a/manifests/1"] = challenge
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "a", retries=0).ensure(f"{fake.host}/team/a:1")
    assert err.value.cause == "UNAUTHORIZED" and "plain http" in err.value.message
    fake.routes["/v2/team/b/manifests/1"] = redirect
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "b", retries=0).ensure(f"{fake.host}/team/b:1")
    assert "redirected to plain http at cdn.example" in err.value.message


def test_https_registries_are_verified_with_the_given_ca(fake, tmp_path):
    """The fake registry behind TLS with a certificate for 127.0.0.1 from a throwaway CA; the client
    is told to use HTTPS as it would for any non-loopback registry."""
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from synapse.core.jobs.imageref import parse
    from synapse.images.sources import RegistrySource
    from synapse.images.store import _resolve

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test registry")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    fake.server.socket = context.wrap_socket(fake.server.socket, server_side=True)
    img = busybox_image()
    fake.serve_image("team/tls", "1", img)
    ref = parse(f"{fake.host}/team/tls:1")

    trusted = RegistryClient(ref.registry, ca_file=tmp_path / "cert.pem", retries=0)
    trusted.plain = False
    assert _resolve(RegistrySource(ref, trusted), str(ref), None)[0] == img.digest
    untrusted = RegistryClient(ref.registry, retries=0)  # the system's CAs do not know this one
    untrusted.plain = False
    with pytest.raises(PullError) as err:
        _resolve(RegistrySource(ref, untrusted), str(ref), None)
    assert err.value.cause == "UNREACHABLE" and "TLS" in err.value.message
