"""The image store with local sources (oci:, oci-archive:, dir:): layers applied exactly as the OCI
rules say (compared with umoci), unsafe layers refused with nothing left behind, every blob
verified, LRU eviction of unpinned images, and the state surviving a new store on the same root
(running an image and comparing with umoci: tests/cluster/test_image_store.py).

Images are built offline by tests/support/images.py; no registry is needed here
(tests/cluster/test_image_registry.py covers pulling)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse.images.store import ImageStore, PullError
from synapse.images.unpack import apply_layer
from tests.support.images import (
    BUSYBOX,
    E,
    busybox_image,
    layer_tar,
    layered_image,
    leftovers,
    make_image,
    make_layer,
    write_archive,
    write_layout,
)

pytestmark = pytest.mark.skipif(not BUSYBOX.exists(), reason="busybox-static is not installed "
                                                               "(scripts/install-test-packages.sh)")


def test_an_oci_archive_gives_the_same_image_as_its_layout(tmp_path):
    layout = write_layout(tmp_path / "layout", {"v1": busybox_image()})
    archive = write_archive(tmp_path / "train.tar", layout)
    store = ImageStore(tmp_path / "store")
    from_archive = store.ensure(f"oci-archive:{archive}:v1")
    from_layout = store.ensure(f"oci:{layout}:v1")
    assert from_archive.digest == from_layout.digest and from_archive.root == from_layout.root
    assert len(store.cached()) == 1 and len(store.cached()[0].references) == 2
    # With one image in the layout no ref name is needed; with two, one is.
    assert store.ensure(f"oci:{layout}").digest == from_layout.digest
    write_layout(tmp_path / "two", {"a": busybox_image(), "b": layered_image()})
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{tmp_path}/two")
    assert err.value.cause == "BAD_REFERENCE" and "holds 2 images" in err.value.message
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{layout}:nope")
    assert err.value.cause == "NOT_FOUND" and not err.value.node_side


@pytest.mark.parametrize("entries, why", [
    ([E("../escape", data=b"x")], "escapes the root"),
    ([E("a", "dir"), E("a/../../escape", data=b"x")], "escapes the root"),
    ([E("link", "symlink", target="{outside}"), E("link/escape", data=b"x")], "through link, which is a symlink"),
    ([E("up", "symlink", target="../../../../../../.."), E("up/{outside_rel}/escape", data=b"x")],
     "through up, which is a symlink"),
    ([E("h", "hardlink", target="../../../../etc/hostname")], "escapes the root"),
    ([E("h", "hardlink", target="/etc/hostname")], "does not exist"),
    ([E("f", data=b"x"), E("f/under-a-file", data=b"x")], "which is not a directory"),
    ([E("d/" * 300 + "deep", data=b"x")], "more than 256 directories deep"),
])
def test_layers_that_reach_outside_the_root_are_refused_and_leave_nothing(tmp_path, entries, why):
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = [E(e.name.replace("{outside_rel}", str(outside).lstrip("/")), e.kind, e.data,
                 e.target.replace("{outside}", str(outside)), e.mode) for e in entries]
    write_layout(tmp_path / "layout", {"bad": make_image([make_layer([E("ok", data=b"fine")] + entries)])})
    store = ImageStore(tmp_path / "store")
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{tmp_path}/layout:bad")
    assert err.value.cause == "BAD_IMAGE" and why in err.value.message, err.value.message
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape").exists()
    assert leftovers(tmp_path / "store") == [] and store.cached() == []


def test_device_nodes_are_skipped_fifos_made_and_setuid_bits_stripped(tmp_path):
    img = make_image([make_layer([E("dev", "dir"), E("dev/null", "char"), E("run", "dir"), E("run/pipe", "fifo"),
                                  E("bin", "dir"), E("bin/su", data=b"#!", mode=0o4755),
                                  E("shared", "dir", mode=0o2775), E("tmp", "dir", mode=0o1777)])])
    write_layout(tmp_path / "layout", {"x": img})
    root = ImageStore(tmp_path / "store").ensure(f"oci:{tmp_path}/layout:x").root
    assert not (root / "dev" / "null").exists() and (root / "dev").is_dir()
    assert (root / "run" / "pipe").is_fifo()
    assert (root / "bin" / "su").stat().st_mode & 0o7777 == 0o755
    assert (root / "shared").stat().st_mode & 0o7777 == 0o775
    assert (root / "tmp").stat().st_mode & 0o7777 == 0o1777


def test_a_whiteout_under_a_missing_directory_changes_nothing_but_one_through_a_symlink_is_refused(tmp_path):
    ok = make_image([make_layer([E("a", data=b"a")]), make_layer([E("no/such/.wh.thing", data=b"")])])
    bad = make_image([make_layer([E("etc", "dir"), E("link", "symlink", target="etc")]),
                      make_layer([E("link/.wh.passwd", data=b"")])])
    write_layout(tmp_path / "layout", {"ok": ok, "bad": bad})
    store = ImageStore(tmp_path / "store")
    assert sorted(p.name for p in store.ensure(f"oci:{tmp_path}/layout:ok").root.iterdir()) == ["a"]
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{tmp_path}/layout:bad")
    assert err.value.cause == "BAD_IMAGE" and "link, which is a symlink" in err.value.message


def test_content_that_does_not_match_its_digest_is_never_unpacked(tmp_path):
    layout = write_layout(tmp_path / "layout", {"x": busybox_image()})
    manifest = json.loads((layout / "blobs" / "sha256" / json.loads((layout / "index.json").read_text())
                           ["manifests"][0]["digest"].removeprefix("sha256:")).read_text())
    layer = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].removeprefix("sha256:")
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    layer.write_bytes(bytes(data))
    store = ImageStore(tmp_path / "store")
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{layout}:x")
    assert err.value.cause == "DIGEST_MISMATCH" and manifest["layers"][0]["digest"] in err.value.message
    assert leftovers(tmp_path / "store") == [] and list((tmp_path / "store" / "blobs" / "sha256").iterdir()) != []
    assert not (tmp_path / "store" / "blobs" / "sha256" / layer.name).exists()  # only the config got in
    # The config left by the failed pull counts against the budget and goes first when over it.
    assert ImageStore(tmp_path / "store", budget_bytes=1).usage_bytes() == 0
    layer.write_bytes(bytes(data) + b"more")  # longer than its descriptor
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{layout}:x")
    assert err.value.cause == "TOO_LARGE"


def test_a_layer_whose_tar_is_not_its_diff_id_is_refused(tmp_path):
    layer = make_layer([E("a", data=b"a")])
    write_layout(tmp_path / "layout", {"x": make_image([layer], diff_ids=["sha256:" + "0" * 64])})
    store = ImageStore(tmp_path / "store")
    with pytest.raises(PullError) as err:
        store.ensure(f"oci:{tmp_path}/layout:x")
    assert err.value.cause == "DIGEST_MISMATCH" and "diff id" in err.value.message
    assert leftovers(tmp_path / "store") == []


def test_zstd_layers_are_refused_with_a_clear_cause(tmp_path):
    img = make_image([make_layer([E("a", data=b"a")])])
    manifest = json.loads(img.manifest)
    manifest["layers"][0]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+zstd"
    img.manifest = json.dumps(manifest).encode()
    write_layout(tmp_path / "layout", {"z": img})
    with pytest.raises(PullError) as err:
        ImageStore(tmp_path / "store").ensure(f"oci:{tmp_path}/layout:z")
    assert err.value.cause == "BAD_IMAGE" and "zstd" in err.value.message


def test_dir_images_are_used_in_place_but_never_the_nodes_own_root(tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    store = ImageStore(tmp_path / "store")
    image = store.ensure(f"dir:{rootfs}")
    assert image.root == rootfs and image.digest == "" and store.has(f"dir:{rootfs}")
    (tmp_path / "to-root").symlink_to("/")
    for bad in ("to-root",):
        with pytest.raises(PullError) as err:
            store.ensure(f"dir:{tmp_path}/{bad}")
        assert err.value.cause == "BAD_IMAGE" and "resolves to /" in err.value.message
    with pytest.raises(PullError) as err:
        store.ensure(f"dir:{tmp_path}/missing")
    assert err.value.cause == "NOT_FOUND"
    with pytest.raises(PullError) as err:
        store.ensure("dir:relative")
    assert err.value.cause == "BAD_REFERENCE" and "absolute" in err.value.message


def _sized_image(tag: str, size: int = 1 << 20):
    """An image of about `size` bytes that does not compress (so blob and root are each ~size)."""
    return make_image([make_layer([E(f"{tag}.bin", data=os.urandom(size))])])


def test_unpinned_images_are_evicted_least_recently_used_first_over_the_budget(tmp_path):
    write_layout(tmp_path / "layout", {t: _sized_image(t) for t in "abcd"})
    ref = f"oci:{tmp_path}/layout:{{}}".format
    store = ImageStore(tmp_path / "store", budget_bytes=5_000_000)  # room for two images of ~2.1 MB
    a = store.ensure(ref("a"), holder="task-1")
    store.ensure(ref("b"))
    store.ensure(ref("c"))  # over budget: b is the least recently used unpinned one
    assert [store.has(ref(t)) for t in "abc"] == [True, False, True]
    assert a.root.is_dir() and store.usage_bytes() <= 5_000_000
    assert len(list((tmp_path / "store" / "blobs" / "sha256").iterdir())) == 4  # b's config and layer went too
    store.release("task-1")
    assert store.has(ref("a"))  # within budget: nothing to evict yet
    store.ensure(ref("c"))  # c is now the most recent
    store.ensure(ref("d"))  # a is the least recently used and no longer pinned
    assert [store.has(ref(t)) for t in "abcd"] == [False, False, True, True]
    assert not a.root.exists()
    # A pinned store over budget keeps its images: running tasks keep their roots.
    tight = ImageStore(tmp_path / "tight", budget_bytes=1)
    pinned = [tight.ensure(ref(t), holder=f"t{t}").root for t in "ab"]
    assert all(p.is_dir() for p in pinned) and {c.holders for c in tight.cached()} == {("ta",), ("tb",)}


def test_a_new_store_on_the_same_root_keeps_images_and_pins(tmp_path):
    layout = write_layout(tmp_path / "layout", {"v": busybox_image()})
    first = ImageStore(tmp_path / "store", budget_bytes=1)
    image = first.ensure(f"oci:{layout}:v", holder="job-1/0")
    shutil.rmtree(layout)  # the restarted worker cannot pull it again: it must find it
    (tmp_path / "store" / "tmp" / "half-done").mkdir()  # a pull the old worker died in
    second = ImageStore(tmp_path / "store", budget_bytes=1)
    assert second.has(f"oci:{layout}:v") and leftovers(tmp_path / "store") == [
        "images/" + image.digest.removeprefix("sha256:")]
    assert [(c.digest, c.holders) for c in second.cached()] == [(image.digest, ("job-1/0",))]
    again = second.ensure(f"oci:{layout}:v", holder="job-1/0")
    assert again == image and again.config == image.config
    second.release("job-1/0")
    assert not second.has(f"oci:{layout}:v") and not image.root.exists()  # unpinned over budget: evicted


def test_an_unreadable_state_file_removes_no_root_a_task_may_use(tmp_path):
    layout = write_layout(tmp_path / "layout", {"v": busybox_image()})
    image = ImageStore(tmp_path / "store").ensure(f"oci:{layout}:v", holder="job-1/0")
    (tmp_path / "store" / "state.json").write_text("{not json")
    store = ImageStore(tmp_path / "store", budget_bytes=1)
    assert image.root.is_dir() and (tmp_path / "store" / "state.unreadable").exists()
    assert store.cached() == [] and store.ensure(f"oci:{layout}:v").root == image.root  # pulled again in place


#: Names and targets that make the dangerous sequences likely: a symlink out of the root, then
#: writes, links and whiteouts through it.
_NAMES = ["link", "link/a", "link/b/c", "a", "a/link", "a/link/x", "../a", ".wh.link", "link/.wh..wh..opq",
          "a/.wh.link", "/link/a"]
_KINDS = ["symlink"] * 6 + ["file"] * 6 + ["dir"] * 3 + ["hardlink"] * 3 + ["fifo", "char"]
_TARGETS = {"symlink": ["{outside}", "../../outside", "/", ".."],
            "hardlink": ["a", "link", "link/a", "{outside}/x", "../outside/x"]}


@st.composite
def _entries(draw):
    entries = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(_KINDS))
        target = draw(st.sampled_from(_TARGETS[kind])) if kind in _TARGETS else ""
        entries.append(E(draw(st.sampled_from(_NAMES)), kind, b"data", target))
    return entries


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.lists(_entries(), min_size=1, max_size=3))
def test_no_sequence_of_layers_writes_outside_the_root(layers):
    """Whatever the entries (escaping names, symlinks to outside then writes through them, hard links
    out, whiteouts of links), applying them changes nothing outside the root, and a refusal is a
    PullError, never another exception."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        outside = tmp / "outside"
        outside.mkdir()
        (outside / "x").write_text("untouched")
        root = tmp / "root"
        root.mkdir()
        before = sorted((str(p), p.is_symlink() or p.read_bytes() if p.is_file() else None)
                        for p in tmp.rglob("*") if root not in p.parents and p != root)
        for i, entries in enumerate(layers):
            entries = [E(e.name, e.kind, e.data, e.target.replace("{outside}", str(outside))) for e in entries]
            raw = layer_tar(entries)
            blob = tmp / f"layer{i}"
            blob.write_bytes(raw)
            try:
                apply_layer(root, blob, "sha256:" + hashlib.sha256(raw).hexdigest(), f"layer {i}")
            except PullError as exc:
                assert exc.cause == "BAD_IMAGE", exc
                break
            finally:
                blob.unlink()
        after = sorted((str(p), p.is_symlink() or p.read_bytes() if p.is_file() else None)
                       for p in tmp.rglob("*") if root not in p.parents and p != root)
        assert after == before
