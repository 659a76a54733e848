"""The image store where it runs programs: an unpacked image runs, whiteouts apply as umoci applies
them, and a full disk leaves no partial root (the rest of the store is in
tests/unit/test_image_store.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import pytest

from synapse.images.store import ImageStore, PullError
from tests.support.images import (
    BUSYBOX,
    E,
    busybox_image,
    layered_image,
    leftovers,
    make_image,
    make_layer,
    tree,
    write_layout,
)

pytestmark = pytest.mark.skipif(not BUSYBOX.exists(), reason="busybox-static is not installed "
                                                               "(scripts/install-test-packages.sh)")


def test_an_oci_layout_image_unpacks_and_runs(tmp_path):
    write_layout(tmp_path / "layout", {"1.0": busybox_image()})
    store = ImageStore(tmp_path / "store")
    seen = []
    image = store.ensure(f"oci:{tmp_path}/layout:1.0", progress=seen.append)
    assert image.config.env == ("PATH=/bin", "IMAGE=busybox") and image.config.cmd == ("/bin/sh",)
    out = subprocess.run([image.root / "bin" / "busybox", "cat", image.root / "etc" / "hostname"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "image\n"
    assert os.readlink(image.root / "bin" / "sh") == "busybox"
    phases = [p.phase for p in seen]
    assert phases[0] == "manifest" and phases[-1] == "done" and "layers" in phases and "unpack" in phases
    assert max(p.done_bytes for p in seen if p.phase == "layers") == seen[-2].total_bytes > 1_000_000
    assert store.has(f"oci:{tmp_path}/layout:1.0") and not store.has(f"oci:{tmp_path}/layout:2.0")


def test_whiteouts_opaque_dirs_hard_links_and_symlinks_apply_as_umoci_applies_them(tmp_path):
    write_layout(tmp_path / "layout", {"l": layered_image()})
    root = ImageStore(tmp_path / "store").ensure(f"oci:{tmp_path}/layout:l").root
    mine = tree(root)
    assert "etc/gone" not in mine and "data/sub/deep" not in mine and mine["data/sub/fresh"][1] == b"fresh\n"
    assert "opq/lower1" not in mine and "opq/lowerdir" not in mine and mine["opq/upper"][1] == b"upper\n"
    assert mine["(hard links)"] == (("etc/keep", "hard/lower"), ("hard/a", "hard/b"))
    assert mine["lib/link.so"] == ("symlink", "/lib/real.so") and mine["abs"] == ("symlink", "/etc/keep")
    assert mine["becomes-dir"] == ("dir",) and mine["becomes-file"][0] == "file" and mine["data/old"][1] == b"new\n"
    assert {v[3] for v in mine.values() if v and v[0] == "file"} == {1_700_000_000}  # mtimes as in the image
    if not shutil.which("umoci"):
        pytest.skip("umoci is not installed (scripts/install-test-packages.sh)")
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{tmp_path}/layout:l", str(tmp_path / "bundle")],
                   check=True, capture_output=True)
    assert mine == tree(tmp_path / "bundle" / "rootfs")


def test_a_full_disk_during_unpack_is_disk_full_and_leaves_no_partial_root(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        # 4 MB of zeros: the gzip blob is a few KB and fits, the unpacked file does not.
        img = make_image([make_layer([E("big", data=b"\0" * 4_000_000)])])
        write_layout(tmp_path / "layout", {"big": img})
        store = ImageStore(mount / "store")
        with pytest.raises(PullError) as err:
            store.ensure(f"oci:{tmp_path}/layout:big")
        assert err.value.cause == "DISK_FULL" and err.value.node_side
        assert leftovers(mount / "store") == [] and store.cached() == []
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", str(mount)], check=True)
