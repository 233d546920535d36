"""The datasets' content checked before anything is trusted (:mod:`dmlbench.data.content`): the
published counts, per dataset, after unpacking and again by prepare; a deliberate subset only
with ``source.allow_subset`` (said in info.json and the report's setup); an image listed but not
in the archive counted, never silently dropped; and each reader's mistake in one line, with the
user-error exit status (2) of the real stage script and nothing recorded (no raw files, no
``data/<file>.sha256``). Archives come from tests/helpers/archives.py and tests/helpers/fabricate.py, in their
published layouts."""

from __future__ import annotations

import shutil
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from helpers.fabricate import (
    CATEGORY_AND_ATTRIBUTE,
    CONSUMER_TO_SHOP,
    CarsRelease,
    cub_full,
    error_lines,
    highres_zip,
    run_stage,
    tar_files,
    tree,
    zip_files,
)

from dmlbench.data import DATASETS
from dmlbench.data.cache import PreparedDataset
from dmlbench.io import md5_file, read_json

PUBLISHED = {  # images, classes, {split: (images, classes)}: the figures each module cites
    "cub200": (11_788, 200, {"train": (5_864, 100), "test": (5_924, 100)}),
    "cars196": (16_185, 196, {"train": (8_054, 98), "test": (8_131, 98)}),
    "sop": (120_053, 22_634, {"train": (59_551, 11_318), "test": (60_502, 11_316)}),
    "inshop": (52_712, 7_982, {"train": (25_882, 3_997), "query": (14_218, 3_985), "gallery": (12_612, 3_985)}),
}
PINNED = {"cub200": "archive", "sop": "archive"}  # the test archives are not the release: their md5 pinned


def test_the_published_counts_table():
    for name, (images, classes, splits) in PUBLISHED.items():
        counts = DATASETS[name].counts
        assert counts is not None and counts.source, name
        assert (counts.images, counts.classes) == (images, classes)
        assert {split: (i, c) for split, i, c in counts.splits} == splits
        assert sum(i for i, _ in splits.values()) == images  # the halves add up
    assert DATASETS["glyphs"].counts is None  # generated: nothing published


def source_for(dataset: str, archives: dict, **extra) -> dict:
    """``source:`` pinning the md5 of the test archives (datasets with a published md5)."""
    if dataset == "cars196":
        md5 = archives["cars196"]["md5"]
        extra |= {"images": {"md5": md5["car_ims.tgz"]}, "annotations": {"md5": md5["cars_annos.mat"]}}
    elif dataset in PINNED:
        (md5,) = archives[dataset]["md5"].values()
        extra |= {PINNED[dataset]: {"md5": md5}}
    return extra


def place(project: Path, paths: list[Path]) -> Path:
    dropbox = project / "data"
    dropbox.mkdir(exist_ok=True)
    for path in paths:
        shutil.copy(path, dropbox / path.name)
    return dropbox


def nothing_recorded(project: Path, dataset: str) -> bool:
    return not (project / "artifacts/raw" / dataset).exists() and not list((project / "data").glob("*.sha256"))


def section(source: dict, **entry) -> dict:
    return {"source": source, "image_size": 16, "split": {"scheme": "standard"}, **entry}


# --------------------------------------------------------------------------- the counts


@pytest.mark.parametrize("dataset", list(PUBLISHED))
def test_a_copy_short_of_the_published_counts_is_refused_unless_a_deliberate_subset(
    dataset, tmp_path, real_format_archives
):
    files = real_format_archives[dataset]["files"]
    place(tmp_path, files)
    source = source_for(dataset, real_format_archives)
    code, err = run_stage(tmp_path, "download", dataset, section(source))
    (line,) = error_lines(err)
    spec = DATASETS[dataset]
    found = {"cub200": 400, "cars196": 392, "sop": 72, "inshop": real_format_archives["inshop"]["images"]}[dataset]
    assert code == 2 and line.startswith(f"error: {dataset}: {' + '.join(p.name for p in files)} lists {found} images")
    assert line.endswith(
        f"; the published release has {spec.counts.describe()} ({spec.counts.source}): an incomplete copy or a "
        f"subset: set datasets.{dataset}.source.allow_subset: true to use it as a deliberate subset "
        "(the report says so)"
    )
    assert nothing_recorded(tmp_path, dataset)

    deliberate = section({**source, "allow_subset": True})
    assert run_stage(tmp_path, "download", dataset, deliberate)[0] == 0
    assert run_stage(tmp_path, "prepare", dataset, deliberate)[0] == 0
    counts = PreparedDataset.load(tmp_path / "artifacts/prepared" / dataset).info["counts"]
    assert counts["subset"] and counts["allow_subset"] and counts["listed"]["images"] == found
    assert counts["published"]["images"] == spec.counts.images and counts["prepared"]["images"] == found

    # prepare counts again, from what it reads: the same copy without allow_subset is refused there too
    code, err = run_stage(tmp_path, "prepare", dataset, section(source))
    (line,) = error_lines(err)
    assert code == 2 and line.startswith(f"error: {dataset}: {Path('artifacts/raw') / dataset} lists {found} images")


def test_more_than_the_release_is_refused_even_as_a_subset(tmp_path, real_format_archives):
    src = real_format_archives["cub200"]["files"][0].parent / "cub_src"
    files = tree(src / "CUB_200_2011")
    files["CUB_200_2011/classes.txt"] = (src / "CUB_200_2011/classes.txt").read_bytes() + b"201 201.Extra_bird\n"
    files["CUB_200_2011/images.txt"] = (src / "CUB_200_2011/images.txt").read_bytes() + b"401 201.Extra_bird/x.jpg\n"
    labels = (src / "CUB_200_2011/image_class_labels.txt").read_bytes() + b"401 201\n"
    files["CUB_200_2011/image_class_labels.txt"] = labels
    files["CUB_200_2011/images/201.Extra_bird/x.jpg"] = sorted((src / "CUB_200_2011/images").rglob("*.jpg"))[0]
    archive = tar_files(tmp_path / "CUB_200_2011.tgz", dict(files))
    place(tmp_path, [archive])
    code, err = run_stage(
        tmp_path, "download", "cub200", section({"archive": {"md5": md5_file(archive)}, "allow_subset": True})
    )
    (line,) = error_lines(err)
    assert code == 2 and "lists 401 images of 201 classes (train 200 / 100, test 201 / 101)" in line
    assert line.endswith(": more than the published release: another release or another dataset")


def test_full_size_cub_passes_without_allow_subset(tmp_path):
    """CUB-200-2011 at its published 11,788 images (tiny ones): the download stage's content check
    and prepare pass with the counts as published, nothing said about a subset."""
    started = time.perf_counter()
    archive = cub_full(tmp_path / "CUB_200_2011.tgz")
    place(tmp_path, [archive])
    entry = section({"archive": {"md5": md5_file(archive)}}, image_size=8)
    assert run_stage(tmp_path, "download", "cub200", entry)[0] == 0
    code, err = run_stage(tmp_path, "prepare", "cub200", entry)
    assert code == 0, err[-2000:]
    info = PreparedDataset.load(tmp_path / "artifacts/prepared/cub200", in_memory=False).info
    assert info["num_images"] == 11_788 and not info["counts"]["subset"] and info["skipped"] == []
    assert info["counts"]["listed"] == info["counts"]["published"] == DATASETS["cub200"].counts.as_dict()
    assert info["splits"] == {"train": {"images": 5_864, "classes": 100}, "test": {"images": 5_924, "classes": 100}}
    print(f"full-size CUB: {time.perf_counter() - started:.1f} s")


def test_a_subset_and_left_out_images_are_said_in_the_report_setup(small_params):
    from dmlbench.analysis.sections import setup
    from dmlbench.analysis.sections.base import Document

    counts = {
        "published": DATASETS["cub200"].counts.as_dict(),
        "listed": {"images": 400, "classes": 200, "splits": {}},
        "allow_subset": True,
        "subset": True,
        "left_out": {"missing": 1, "unreadable": 2},
    }
    info = {"splits": {"train": {"images": 197, "classes": 100}}, "image_size": 16, "counts": counts}
    analysis = SimpleNamespace(
        params=small_params,
        results=SimpleNamespace(datasets={"cub200": info}, selections=pd.DataFrame()),
        names={loss: loss for loss in small_params.losses},
    )
    doc = Document(Path("."))
    setup.write(analysis, doc)
    text = doc.text()
    assert (
        "- `cub200` is a deliberate subset (`source.allow_subset: true`): 400 of the published 11,788 images, "
        "200 of 200 classes." in text
    )
    assert "- `cub200`: 3 listed image(s) left out (`skip_corrupt: true`; 1 not in the archive, 2 unreadable" in text


def test_an_inshop_gallery_image_missing_from_the_zip_is_counted(tmp_path, real_format_archives):
    """The partition lists an image img.zip lacks: download says so and records no sha256; prepare
    refuses it, or with skip_corrupt leaves it out of the gallery, counted in info.json."""
    img_zip, partition = real_format_archives["inshop"]["files"]
    with zipfile.ZipFile(img_zip) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
    gallery = next(line.split()[0] for line in partition.read_text().splitlines() if line.endswith("gallery"))
    del entries[gallery]
    place(tmp_path, [zip_files(tmp_path / "img.zip", dict(entries)), partition])
    code, err = run_stage(tmp_path, "download", "inshop", section({"allow_subset": True}))
    assert code == 0 and f"inshop: 1 listed image(s) not in img.zip + list_eval_partition.txt ({gallery})" in err
    assert not list((tmp_path / "data").glob("*.sha256"))
    code, err = run_stage(tmp_path, "prepare", "inshop", section({"allow_subset": True}))
    assert code == 2 and error_lines(err) == [
        f"error: inshop: 1 listed image(s) not in artifacts/raw/inshop ({gallery}): the archive lacks them; set "
        "datasets.inshop.skip_corrupt: true to leave them out (counted)"
    ]
    code, err = run_stage(tmp_path, "prepare", "inshop", section({"allow_subset": True}, skip_corrupt=True))
    assert code == 0 and "inshop: 1 listed image(s) left out (skip_corrupt: true): 1 not in the archive" in err
    info = read_json(tmp_path / "artifacts/prepared/inshop/info.json")
    assert info["skipped"] == [{"path": gallery, "error": "listed but not in the archive"}]
    assert info["splits"]["gallery"]["images"] == info["counts"]["listed"]["splits"]["gallery"][0] - 1


# --------------------------------------------------------------------------- each reader's mistakes


def test_a_cub_archive_without_classes_txt(tmp_path, real_format_archives):
    src = real_format_archives["cub200"]["files"][0].parent / "cub_src"
    files = {name: path for name, path in tree(src / "CUB_200_2011").items() if not name.endswith("classes.txt")}
    archive = tar_files(tmp_path / "CUB_200_2011.tgz", dict(files))
    place(tmp_path, [archive])
    code, err = run_stage(tmp_path, "download", "cub200", section({"archive": {"md5": md5_file(archive)}}))
    assert code == 2 and error_lines(err) == [
        "error: cub200: CUB_200_2011.tgz: no CUB_200_2011/classes.txt; expected the CUB_200_2011.tgz layout: "
        "CUB_200_2011/images.txt, image_class_labels.txt, classes.txt and images/ (classes.txt: <label> <class_name>)"
    ]
    assert nothing_recorded(tmp_path, "cub200")


def test_an_sop_zip_without_its_top_folder(tmp_path, real_format_archives):
    src = real_format_archives["sop"]["files"][0].parent / "sop_src" / "Stanford_Online_Products"
    archive = zip_files(tmp_path / "Stanford_Online_Products.zip", {n: p for n, p in tree(src, ".").items()})
    place(tmp_path, [archive])
    code, err = run_stage(tmp_path, "download", "sop", section({"archive": {"md5": md5_file(archive)}}))
    assert code == 2 and error_lines(err) == [
        "error: sop: Stanford_Online_Products.zip: no Stanford_Online_Products/Ebay_train.txt (the files hold "
        "Ebay_train.txt instead); expected the published zip's layout: everything under its top folder "
        "Stanford_Online_Products/ (Ebay_train.txt, Ebay_test.txt, the 12 <category>_final/ folders)"
    ]
    assert nothing_recorded(tmp_path, "sop")


PARTITION_MISTAKES = {
    "no count line": (
        lambda text: text.split("\n", 1)[1],
        "list_eval_partition.txt: line 1 is In-Shop's header line, expected the image count (the release's line 1 "
        "is 52712, line 2 the header): a copy without its count line, or another file",
    ),
    "consumer-to-shop": (
        lambda text: CONSUMER_TO_SHOP,
        "list_eval_partition.txt is the partition file of DeepFashion's Consumer-to-shop Clothes Retrieval "
        "benchmark; In-Shop needs the In-shop Clothes Retrieval Benchmark's Eval/list_eval_partition.txt (header "
        "'image_name item_id evaluation_status', status train / query / gallery; "
        "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html)",
    ),
    "category and attribute": (
        lambda text: CATEGORY_AND_ATTRIBUTE,
        "list_eval_partition.txt is the partition file of DeepFashion's Category and Attribute Prediction benchmark",
    ),
}


@pytest.mark.parametrize("mistake", list(PARTITION_MISTAKES))
def test_an_inshop_partition_file_that_is_not_in_shops(mistake, tmp_path, real_format_archives):
    img_zip, partition = real_format_archives["inshop"]["files"]
    edit, expected = PARTITION_MISTAKES[mistake]
    dropbox = place(tmp_path, [img_zip])
    (dropbox / partition.name).write_text(edit(partition.read_text()))
    code, err = run_stage(tmp_path, "download", "inshop", section({"allow_subset": True}))
    (line,) = error_lines(err)
    assert code == 2 and line.startswith(f"error: inshop: img.zip + list_eval_partition.txt: {expected}")
    assert nothing_recorded(tmp_path, "inshop")  # neither file: the right partition file is accepted next
    (dropbox / partition.name).write_text(partition.read_text())
    assert run_stage(tmp_path, "download", "inshop", section({"allow_subset": True}))[0] == 0
    assert {p.name for p in dropbox.glob("*.sha256")} == {"img.zip.sha256", "list_eval_partition.txt.sha256"}


def test_a_truncated_img_zip(tmp_path, real_format_archives):
    img_zip, partition = real_format_archives["inshop"]["files"]
    dropbox = place(tmp_path, [partition])
    (dropbox / "img.zip").write_bytes(img_zip.read_bytes()[: img_zip.stat().st_size // 2])
    code, err = run_stage(tmp_path, "download", "inshop", section({"allow_subset": True}))
    (line,) = error_lines(err)
    assert code == 2 and line.startswith(
        "error: data/img.zip: truncated: it starts as a zip archive but its end (the central directory) is missing"
    )
    assert "neither a zip nor a tar" not in line and nothing_recorded(tmp_path, "inshop")


def test_a_truncated_tgz(tmp_path, real_format_archives):
    archive = real_format_archives["cub200"]["files"][0]
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    (dropbox / archive.name).write_bytes(archive.read_bytes()[:-5000])
    code, err = run_stage(
        tmp_path, "download", "cub200", section({"archive": {"md5": md5_file(dropbox / archive.name)}})
    )
    (line,) = error_lines(err)
    assert code == 2 and line.startswith("error: data/CUB_200_2011.tgz: truncated: the compressed data stops")
    assert not (tmp_path / "artifacts/raw/cub200").exists()


def test_the_password_protected_img_highres_zip(tmp_path, real_format_archives):
    img_zip, partition = real_format_archives["inshop"]["files"]
    dropbox = place(tmp_path, [partition])
    highres_zip(img_zip, dropbox / "img_highres.zip", password=b"the-form's-answer")
    code, err = run_stage(tmp_path, "download", "inshop", section({"allow_subset": True}))
    (line,) = error_lines(err)
    entries = real_format_archives["inshop"]["images"]
    assert code == 2 and line.startswith(
        f"error: data/img_highres.zip: password-protected ({entries} of {entries} entries encrypted, e.g. img_highres/"
    )
    assert line.endswith(
        "DeepFashion encrypts img_highres.zip; ask for its password with the agreement form of "
        "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html, unpack it (unzip -P <password> img_highres.zip) "
        "and zip the img_highres/ folder again without one as data/img_highres.zip, or use img.zip "
        "(docs/datasets.md#in-shop)"
    )
    assert "Traceback" not in err and nothing_recorded(tmp_path, "inshop")


def test_the_offline_error_says_what_happened_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")
    (tmp_path / "data").mkdir()
    code, err = run_stage(tmp_path, "download", "sop", section({}))
    assert code == 2 and error_lines(err) == [
        "error: sop: Stanford_Online_Products.zip is not in data/ and this job runs offline (DMLBENCH_OFFLINE=1): "
        "run `make fetch` where the internet is (the login node), then run again"
    ]


def test_not_an_archive_at_all(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "CUB_200_2011.tgz").write_text("<html>Not Found</html>")
    code, err = run_stage(
        tmp_path, "download", "cub200", section({"archive": {"md5": md5_file(tmp_path / "data/CUB_200_2011.tgz")}})
    )
    assert code == 2 and error_lines(err) == [
        "error: data/CUB_200_2011.tgz: neither a zip nor a tar archive (22 bytes, starting b'<htm')"
    ]


# --------------------------------------------------------------------------- which file is used


def test_img_highres_zip_is_used_when_it_is_there_and_says_what_it_ignores(tmp_path, real_format_archives):
    img_zip, partition = real_format_archives["inshop"]["files"]
    dropbox = place(tmp_path, [img_zip, partition])  # img.zip: perhaps an earlier run's download
    highres_zip(img_zip, dropbox / "img_highres.zip")  # unpacked with its password, zipped again without
    code, err = run_stage(tmp_path, "download", "inshop", section({"allow_subset": True}))
    assert code == 0 and "inshop: using img_highres.zip; img.zip in data/ is ignored" in err
    assert run_stage(tmp_path, "prepare", "inshop", section({"allow_subset": True}))[0] == 0
    manifest = PreparedDataset.load(tmp_path / "artifacts/prepared/inshop").manifest
    assert (
        manifest.path.str.startswith("img_highres/").all() and len(manifest) == real_format_archives["inshop"]["images"]
    )
    assert {p.name for p in dropbox.glob("*.sha256")} == {"img_highres.zip.sha256", "list_eval_partition.txt.sha256"}


def test_make_fetch_fetches_only_the_files_the_run_uses(
    tmp_path, file_server, real_format_archives, default_raw_params
):
    """``make fetch`` neither downloads img.zip beside an img_highres.zip nor verifies a stray
    cars_annos.mat beside Kaggle's files (whose md5 is not the Stanford release's)."""
    import copy

    from dmlbench.params.load import parse_params
    from dmlbench.pipeline.fetch import fetch_archives

    img_zip, partition = real_format_archives["inshop"]["files"]
    dropbox = place(tmp_path, [partition])
    highres_zip(img_zip, dropbox / "img_highres.zip")
    (dropbox / "cars_annos.mat").write_bytes(b"Kaggle's copy")
    release = CarsRelease(tmp_path / "cars")
    release.kaggle_images_zip(dropbox / "stanford-cars-dataset.zip")
    release.kaggle_meta_zip(dropbox / "standford-cars-dataset-meta.zip")
    raw = copy.deepcopy(default_raw_params)
    img_url = f"{file_server.url}/img.zip"
    raw["datasets"] = {
        "inshop": {"source": {"images": {"url": img_url}}},
        "cars196": {"source": {}},
    }
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "published"
    raw["tuning"]["baselines"] = []
    assert fetch_archives(parse_params(raw), dropbox) == []
    assert file_server.requests == [] and not (dropbox / "img.zip").exists()
