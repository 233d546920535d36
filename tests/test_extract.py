"""Extraction without ``tarfile``'s PEP 706 filters (Debian 12's system Python 3.11.2 has no
``tarfile.data_filter`` and its ``TarFile.extract`` takes no ``filter=``): the same archives are
unpacked, and the same unsafe entries refused, as with the filters."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile

import pytest
from helpers.archives import tar_of

from dmlbench.data import cub200
from dmlbench.data.archives import fetch_archives
from dmlbench.data.extract import extract_archive, has_data_filter
from dmlbench.errors import DataError


@pytest.fixture
def no_data_filter(monkeypatch):
    """``tarfile`` as on Python 3.11.2: no ``data_filter``, and ``extract(filter=...)`` is a TypeError."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    original = tarfile.TarFile.extract

    def extract(self, member, path="", set_attrs=True, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extract() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return original(self, member, path, set_attrs, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extract", extract)


def test_the_fake_is_python_3_11_2(no_data_filter, tmp_path):
    archive = tar_of(tmp_path / "a.tgz", [({"name": "a.txt"}, b"a")])
    assert not has_data_filter()
    with tarfile.open(archive) as tar, pytest.raises(TypeError, match="unexpected keyword argument 'filter'"):
        tar.extract(tar.getmember("a.txt"), tmp_path / "out", filter="data")


def test_files_and_directories_are_written_without_filters(no_data_filter, tmp_path):
    entries = [
        ({"name": "root", "type": tarfile.DIRTYPE, "mode": 0o700}, None),
        ({"name": "root/images/a.jpg", "mode": 0o6666}, b"jpeg bytes"),  # set-uid/gid, world-writable
        ({"name": "root/tool.sh", "mode": 0o755}, b"#!/bin/sh\n"),
        ({"name": "root/deep/er/b.txt", "mode": 0o600, "uid": 0, "uname": "root"}, b"b" * 100_000),
    ]
    out = tmp_path / "out"
    extract_archive(tar_of(tmp_path / "ok.tgz", entries), out)
    assert (out / "root/images/a.jpg").read_bytes() == b"jpeg bytes"
    assert (out / "root/deep/er/b.txt").read_bytes() == b"b" * 100_000
    assert stat.S_IMODE((out / "root/images/a.jpg").stat().st_mode) == 0o644  # no set-id, no group/other write
    assert stat.S_IMODE((out / "root/tool.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "root/deep/er/b.txt").stat().st_mode) == 0o644


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "../evil.txt"}, "would be written outside"),
        ({"name": "ok/../../evil.txt"}, "would be written outside"),
        ({"name": "/tmp/evil.txt"}, "absolute path"),
        ({"name": "link", "type": tarfile.SYMTYPE, "linkname": "../../etc"}, "is a link to '../../etc'"),
        ({"name": "inner", "type": tarfile.SYMTYPE, "linkname": "ok"}, "is a link"),
        ({"name": "hard", "type": tarfile.LNKTYPE, "linkname": "ok/a.txt"}, "is a link"),
        ({"name": "dev", "type": tarfile.CHRTYPE}, "device or fifo"),
        ({"name": "fifo", "type": tarfile.FIFOTYPE}, "device or fifo"),
    ],
)
def test_unsafe_entries_are_refused_without_filters(no_data_filter, tmp_path, entry, message):
    special = entry.get("type") in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE)
    archive = tar_of(tmp_path / "bad.tgz", [({"name": "ok/a.txt"}, b"fine"), (dict(entry), None if special else b"x")])
    target = tmp_path / "sandbox" / "out"
    with pytest.raises(DataError, match=message):
        extract_archive(archive, target)
    assert not (tmp_path / "sandbox" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    assert not any(path.is_symlink() for path in tmp_path.rglob("*"))


def test_a_link_planted_in_the_target_is_not_followed(no_data_filter, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "a.txt")  # not from the archive: the entry must not write through it
    with pytest.raises(DataError, match="would be written outside"):
        extract_archive(tar_of(tmp_path / "a.tgz", [({"name": "a.txt"}, b"overwritten")]), out)
    assert outside.read_text() == "untouched"


@pytest.mark.parametrize("filters", [True, False])
def test_cub_and_cars_archives_unpack_the_same_with_and_without_filters(
    filters, tmp_path, real_format_archives, request
):
    if not filters:
        request.getfixturevalue("no_data_filter")
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    for dataset in ("cub200", "cars196"):
        for path in real_format_archives[dataset]["files"]:
            shutil.copy(path, dropbox / path.name)
    md5 = real_format_archives["cub200"]["md5"]["CUB_200_2011.tgz"]
    source = cub200.Cub200Source.model_validate({"archive": {"md5": md5}})
    fetch_archives("cub200", (cub200.ARCHIVE,), source, tmp_path / "raw" / "cub200", dropbox)
    images = sorted(p.relative_to(tmp_path / "raw").as_posix() for p in (tmp_path / "raw").rglob("*.jpg"))
    assert len(images) == 400 and images[0].startswith("cub200/CUB_200_2011/images/001.Bird_1/")

    from dmlbench.data import cars196

    md5s = real_format_archives["cars196"]["md5"]
    params = cars196.Cars196Params.model_validate(
        {
            "source": {
                "images": {"md5": md5s["car_ims.tgz"]},
                "annotations": {"md5": md5s["cars_annos.mat"]},
                "allow_subset": True,  # 2 images per class
            }
        }
    )
    cars196.SPEC.fetch(params, tmp_path / "raw" / "cars196", dropbox)
    frame = cars196.read_annotations(params, tmp_path / "raw" / "cars196")
    assert len(frame) == 392 and all((tmp_path / "raw" / "cars196" / path).is_file() for path in frame.path)
