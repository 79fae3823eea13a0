"""The layer checks: pure decisions on plain entries, and the scan over layouts written with tarfile."""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.local.artifacts import ImageRef
from sandfleet.local.errors import ImageConfigError, ImageLayerError, ImageTooLargeError
from sandfleet.local.image import check_working_dir, clear_privileges, scan_layers
from sandfleet.local.layers import (
    MAX_NAME_BYTES,
    Entry,
    EntryKind,
    LayerLimits,
    NodeKind,
    Tally,
    digest_problem,
    entry_problem,
    inside_root,
    layer_compression,
    size_problem,
    space_problem,
    working_dir_problem,
)
from tests.support.hostile_images import TAR_LAYER, ZSTD_LAYER, Layer, Member, write_image

SEGMENT = st.sampled_from(["a", "b", "etc", ".", "..", "", "c.d", ".wh", "x y"])


@given(st.lists(SEGMENT, max_size=12))
def test_a_path_is_inside_exactly_when_no_prefix_climbs_above_the_root(parts: list[str]) -> None:
    depth, escapes = 0, False
    for part in parts:
        if part == "..":
            depth -= 1
            escapes = escapes or depth < 0
        elif part not in ("", "."):
            depth += 1
    path = "/".join(parts)
    normalized = inside_root(path)
    assert (normalized is None) == escapes
    if normalized is not None:
        assert ".." not in normalized.split("/")
        assert "." not in normalized.split("/")
        assert not normalized.startswith("/")
        assert inside_root(normalized) == normalized  # idempotent
        kind_ok = entry_problem(Entry(path or ".", "dir")) is None
        assert kind_ok or path.rstrip("/").rpartition("/")[2].startswith(".wh")


@given(st.lists(SEGMENT, max_size=12))
def test_any_path_that_escapes_is_refused_as_every_kind(parts: list[str]) -> None:
    path = "/".join(parts)
    if inside_root(path) is not None:
        return
    kinds: tuple[EntryKind, ...] = ("file", "dir", "symlink", "fifo")
    for kind in kinds:
        assert "climbs out" in (entry_problem(Entry(path, kind)) or "")


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("etc/passwd", "etc/passwd"),
        ("/etc/passwd", "etc/passwd"),
        ("./usr/./bin/", "usr/bin"),
        ("a/../b", "b"),
        ("a/b/../../c", "c"),
        ("../etc/passwd", None),
        ("a/../../etc", None),
        ("/..", None),
        ("./", ""),
    ],
)
def test_inside_root(path: str, inside: str | None) -> None:
    assert inside_root(path) == inside


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        (Entry("../../tmp/x", "file"), "climbs out"),
        (Entry("usr/../../x", "dir"), "climbs out"),
        (Entry("innocent", "hardlink", linkname="../../etc/shadow"), "hard link to '../../etc/shadow'"),
        (Entry("innocent", "hardlink", linkname="/"), "hard link to the image's root"),
        (Entry("etc/.wh...", "file"), "whiteout aimed at '..'"),
        (Entry(".wh..", "file"), "whiteout aimed at '.'"),
        (Entry("etc/.wh.", "file"), "whiteout aimed at 'its own directory'"),
        (Entry("../../victim/.wh.file", "file"), "climbs out"),
        (Entry("dev/mem", "char", mode=0o666, device=(1, 1)), "character device node (1:1)"),
        (Entry("dev/tty1", "char", device=(4, 1)), "character device node (4:1)"),
        (Entry("disk", "block", device=(8, 0)), "block device node (8:0)"),
        (Entry("dev/null-block", "block", device=(1, 3)), "block device node"),
        (Entry("./", "symlink", linkname="/"), "replace the image's root"),
        (Entry("a" * (MAX_NAME_BYTES + 1), "file"), f"longer than {MAX_NAME_BYTES} bytes"),
        (Entry("x", "symlink", linkname="/" * (MAX_NAME_BYTES + 1)), "link target longer"),
    ],
)
def test_hostile_entries_are_refused(entry: Entry, fragment: str) -> None:
    assert fragment in (entry_problem(entry) or "")


@pytest.mark.parametrize(
    "entry",
    [
        Entry("etc/alternatives/awk", "symlink", linkname="/usr/bin/mawk"),  # every Debian image
        Entry("escape", "symlink", linkname="/"),
        Entry("up", "symlink", linkname="../../../../../../etc"),
        Entry("usr/bin/su", "file", size=71_000, mode=0o4755),  # cleared once unpacked
        Entry("usr/bin/wall", "file", mode=0o2755),
        Entry("usr/bin/link", "hardlink", linkname="usr/bin/su"),
        Entry("/usr/bin/abs", "hardlink", linkname="/usr/bin/su"),
        Entry("etc/.wh.passwd", "file"),
        Entry("etc/.wh..wh..opq", "file"),
        Entry("run/fifo", "fifo"),
        Entry("dev/null", "char", mode=0o666, device=(1, 3)),  # what mmdebstrap puts in /dev
        Entry("dev/console", "char", mode=0o600, device=(5, 1)),
        Entry("dev/ptmx", "char", mode=0o666, device=(5, 2)),
        Entry("etc/gone", "char", device=(0, 0)),  # an overlayfs-style whiteout
        Entry("./", "dir"),
        Entry("a" * 255, "file"),
    ],
)
def test_what_real_images_hold_is_accepted(entry: Entry) -> None:
    assert entry_problem(entry) is None


def test_the_tally_counts_blocks_and_setid_files() -> None:
    tally = Tally()
    for entry in (
        Entry("a", "file", size=1),
        Entry("b", "file", size=4096),
        Entry("c", "file", size=4097, mode=0o4755),
        Entry("d", "dir"),
        Entry("e", "hardlink", size=0, linkname="a"),
    ):
        tally.add(entry)
    assert (tally.entries, tally.unpacked_bytes, tally.setid_files) == (5, 4 * 4096, 1)


def test_size_and_space_say_the_limit_as_a_number() -> None:
    limits = LayerLimits(max_bytes=1000, max_entries=3, disk_reserve_bytes=500)
    assert size_problem(Tally(entries=3), 1000, limits) is None
    assert "more than 1000 bytes" in (size_problem(Tally(), 1001, limits) or "")
    assert "SANDFLEET_LOCAL_MAX_IMAGE_BYTES" in (size_problem(Tally(), 1001, limits) or "")
    assert "more than 3 entries" in (size_problem(Tally(entries=4), 10, limits) or "")
    assert space_problem(Tally(unpacked_bytes=500), 1000, limits) is None
    problem = space_problem(Tally(unpacked_bytes=501), 1000, limits) or ""
    assert "about 501 bytes" in problem
    assert "1000 are free" in problem
    assert "500 must stay free" in problem


def test_compression_and_digests() -> None:
    assert layer_compression("application/vnd.oci.image.layer.v1.tar+gzip") == "gzip"
    assert layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip") == "gzip"
    assert layer_compression(TAR_LAYER) == "tar"
    with pytest.raises(ValueError, match=r"zstd-compressed.*--dest-compress-format gzip"):
        layer_compression(ZSTD_LAYER)
    with pytest.raises(ValueError, match="not a tar layer"):
        layer_compression("application/vnd.oci.image.layer.v1.tar+bzip2")
    assert digest_problem("sha256:" + "a" * 64) is None
    assert digest_problem("sha256:../../../etc/shadow") is not None
    assert digest_problem("sha512:" + "a" * 128) is not None


def _tree(table: dict[str, tuple[NodeKind, str]]) -> Callable[[str], tuple[NodeKind, str]]:
    return lambda path: table.get(path, ("missing", ""))


@pytest.mark.parametrize(
    ("workdir", "table", "fragment"),
    [
        ("/srv/work", {"srv": ("dir", ""), "srv/work": ("dir", "")}, None),
        ("/does/not/exist", {}, None),  # made by the agent, as runc makes a missing cwd
        ("/app", {"app": ("symlink", "/opt/app"), "opt": ("dir", "")}, None),
        ("/app", {"app": ("symlink", "/srv/host-dir"), "srv": ("dir", "")}, None),  # inside the root
        # Given to the commands' user, a system directory would let it plant /etc/ld.so.preload.
        ("/app", {"app": ("symlink", "/etc"), "etc": ("dir", "")}, "system directory /etc"),
        ("/etc/app", {"etc": ("dir", "")}, "system directory /etc/app"),
        ("/usr", {"usr": ("dir", "")}, "system directory /usr"),
        ("/usr/src/app", {"usr": ("dir", "")}, None),
        ("/up/x", {"up": ("symlink", "../../../../.."), "x": ("dir", "")}, None),  # `..` stops at the root
        ("/a/../b", {}, "has '..' in it"),
        ("/etc/passwd", {"etc": ("dir", ""), "etc/passwd": ("file", "")}, "not a directory"),
        ("/x/y", {"x": ("file", "")}, "goes through /x, which is not a directory"),
        ("/loop", {"loop": ("symlink", "/loop")}, "more than 40 links"),
        ("/a", {"a": ("symlink", "b"), "b": ("symlink", "a")}, "a loop"),
        (
            "/f",
            {"f": ("symlink", "/etc/hostname"), "etc": ("dir", ""), "etc/hostname": ("file", "")},
            "not a dir",
        ),
    ],
)
def test_working_dir(workdir: str, table: dict[str, tuple[NodeKind, str]], fragment: str | None) -> None:
    problem = working_dir_problem(workdir, _tree(table))
    assert (problem is None) if fragment is None else fragment in (problem or "")


# --- the scan over real layouts (tarfile, no umoci) ---------------------------------------------


def test_the_scan_accepts_an_ordinary_image_and_counts_it(tmp_path: Path) -> None:
    image = write_image(
        tmp_path / "ok",
        "ok",
        [
            Layer([Member("etc", "dir", mode=0o755), Member("etc/hostname", data=b"x" * 5000)]),
            Layer(
                [Member("usr/bin/su", data=b"su", mode=0o4755), Member("bin", "symlink", linkname="/usr/bin")]
            ),
        ],
    )
    tally = scan_layers(image, LayerLimits())
    assert (tally.entries, tally.unpacked_bytes, tally.setid_files) == (4, 3 * 4096, 1)


@pytest.mark.parametrize(
    ("members", "fragment"),
    [
        ([Member("../../../tmp/escaped", data=b"x")], "entry '../../../tmp/escaped' climbs out"),
        ([Member("link", "hardlink", linkname="../../etc/shadow")], "hard link to '../../etc/shadow'"),
        ([Member("etc/.wh...", data=b"")], "whiteout aimed at '..'"),
        ([Member("mem", "char", device=(1, 1), mode=0o666)], "character device node"),
        ([Member("sda", "block", device=(8, 0))], "block device node"),
    ],
)
def test_the_scan_names_the_layer_and_the_entry(tmp_path: Path, members: list[Member], fragment: str) -> None:
    image = write_image(tmp_path / "bad", "bad", [Layer([Member("ok", data=b"fine")]), Layer(members)])
    with pytest.raises(ImageLayerError, match="rebuild it without that entry") as refused:
        scan_layers(image, LayerLimits())
    message = str(refused.value)
    assert fragment in message
    manifest_layers = _layer_digests(image)
    assert f"layer {manifest_layers[1]}" in message  # the second layer, by its digest
    assert image.digest in message


def _layer_digests(image: ImageRef) -> list[str]:
    blob = image.layout / "blobs" / "sha256" / image.digest.partition(":")[2]
    return [str(layer["digest"]) for layer in json.loads(blob.read_text())["layers"]]


def test_a_bomb_is_refused_with_the_limit_before_it_is_decompressed_whole(tmp_path: Path) -> None:
    image = write_image(tmp_path / "bomb", "bomb", [Layer([Member("zeros", zeros=64 << 20)])])
    compressed = sum(p.stat().st_size for p in (image.layout / "blobs" / "sha256").iterdir())
    assert compressed < 1 << 20  # 64 MiB of zeros in well under 1 MiB
    with pytest.raises(ImageTooLargeError, match=r"more than 8388608 bytes, the limit"):
        scan_layers(image, LayerLimits(max_bytes=8 << 20))
    assert scan_layers(image, LayerLimits(max_bytes=65 << 20)).unpacked_bytes == 64 << 20


def test_the_byte_limit_is_over_all_layers_together(tmp_path: Path) -> None:
    layers = [Layer([Member(f"f{n}", zeros=3 << 20)]) for n in range(3)]
    image = write_image(tmp_path / "three", "three", layers)
    scan_layers(image, LayerLimits(max_bytes=10 << 20))
    with pytest.raises(ImageTooLargeError, match=f"more than {8 << 20} bytes"):
        scan_layers(image, LayerLimits(max_bytes=8 << 20))


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    image = write_image(tmp_path / "many", "many", [Layer([Member(f"e{n}") for n in range(50)])])
    with pytest.raises(ImageTooLargeError, match="more than 20 entries"):
        scan_layers(image, LayerLimits(max_entries=20))


def test_a_huge_pax_header_is_refused_without_reading_it(tmp_path: Path) -> None:
    image = write_image(tmp_path / "pax", "pax", [Layer([Member("x", pax={"comment": "y" * (2 << 20)})])])
    with pytest.raises(ImageLayerError, match="pax or long-name header is over 1048576 bytes"):
        scan_layers(image, LayerLimits())


def test_a_zstd_layer_is_refused_saying_how_to_convert(tmp_path: Path) -> None:
    image = write_image(tmp_path / "z", "z", [Layer([Member("x")], media_type=ZSTD_LAYER)])
    with pytest.raises(ImageLayerError, match="zstd-compressed"):
        scan_layers(image, LayerLimits())


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_entries_hidden_past_an_unreadable_header_are_refused(tmp_path: Path) -> None:
    # tarfile stops quietly at a header whose checksum is wrong; Go's reader might not. The scan
    # refuses a layer with data past where tarfile stopped, so nothing goes unchecked.
    good = _tar_bytes([("ok", b"fine")])
    hidden = bytearray(_tar_bytes([("../../../tmp/hidden", b"x")]))
    hidden[148:156] = b"0000000\0"  # a wrong checksum
    stream = good[: good.index(b"\0" * 1024, 1024)] + bytes(hidden)
    stream += bytes(-len(stream) % 512)
    image = write_image(tmp_path / "hide", "hide", [Layer(raw=gzip.compress(stream))])
    with pytest.raises(ImageLayerError, match="has data after its last entry"):
        scan_layers(image, LayerLimits())


def test_a_truncated_or_mismatched_layer_is_refused(tmp_path: Path) -> None:
    image = write_image(tmp_path / "cut", "cut", [Layer([Member("x", data=os.urandom(200_000))])])
    (blob,) = [p for p in (image.layout / "blobs" / "sha256").iterdir() if p.stat().st_size > 100_000]
    data = blob.read_bytes()
    blob.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageLayerError, match="not a readable tar"):
        scan_layers(image, LayerLimits())
    blob.write_bytes(data + gzip.compress(b""))  # still a valid stream, but not the digest's
    with pytest.raises(ImageLayerError, match="does not match its digest"):
        scan_layers(image, LayerLimits())


def test_an_uncompressed_layer_is_read_as_it_is(tmp_path: Path) -> None:
    image = write_image(
        tmp_path / "plain",
        "plain",
        [Layer([Member("dev/kmsg", "char", device=(1, 11))], media_type=TAR_LAYER)],
    )
    with pytest.raises(ImageLayerError, match="character device"):
        scan_layers(image, LayerLimits())


def test_clear_privileges_clears_setid_bits_without_following_links(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("host")
    outside.chmod(0o4755)
    su = rootfs / "bin" / "su"
    su.write_text("su")
    su.chmod(0o4755)
    wall = rootfs / "bin" / "wall"
    wall.write_text("wall")
    wall.chmod(0o2711)
    shared = rootfs / "shared"
    shared.mkdir()
    shared.chmod(0o2775)  # a setgid directory only makes new files inherit its group: kept
    (rootfs / "bin" / "to-host").symlink_to(outside)
    assert clear_privileges(rootfs, capabilities=False) == 2
    assert stat.S_IMODE(su.stat().st_mode) == 0o755
    assert stat.S_IMODE(wall.stat().st_mode) == 0o711
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2775
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755


def test_check_working_dir_reads_the_image_without_following_its_links(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    host_dir = tmp_path / "host-only"
    host_dir.mkdir()
    # A link to a host path: inside the image it names <root>/<that path>, which is missing: fine.
    (rootfs / "work").symlink_to(host_dir)
    for workdir, error in (("/work/sub", None), ("/etc/passwd", "not a directory"), ("/a/../etc", "'..'")):
        image = write_image(tmp_path / f"w{abs(hash(workdir))}", "w", [], {"WorkingDir": workdir})
        if error is None:
            check_working_dir(image, rootfs)
        else:
            with pytest.raises(ImageConfigError, match=error):
                check_working_dir(image, rootfs)
    assert not (host_dir / "sub").exists()
