"""CARS196 from the layouts users have: the Kaggle / torchvision layout (``cars_train/``,
``cars_test/``, ``devkit/cars_train_annos.mat``, ``devkit/cars_meta.mat``,
``cars_test_annos_withlabels.mat``; pytorch/vision#7545) as one archive (downloaded from a
mirror, or placed in data/), nested as Kaggle ships it, as the release's separate files, or as
torchvision's unpacked folder; the DML split rebuilt (classes 1-98 / 99-196), the content
checked against the published counts, the sha256 recorded on first use; the pre-flight and the
one-line errors when nothing is there."""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import JPEG_SIZES, write_jpeg

from dmlbench.data import cars196
from dmlbench.data.archives import dataset_problems
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.prepare import prepare_dataset
from dmlbench.errors import DataError
from dmlbench.io import read_json

FIELDS = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")  # the devkit's struct fields


def _annotations(rows: list[tuple[int, str]]) -> np.ndarray:
    """A 1 x N struct array as the devkit's .mat files hold it: (class, fname) per image."""
    table = np.zeros((1, len(rows)), dtype=[(field, "O") for field in FIELDS])
    for i, (label, fname) in enumerate(rows):
        boxes = [np.array([[v]], dtype=np.uint16) for v in (1, 2, 17, 15)]
        table[0, i] = (*boxes, np.array([[label]], dtype=np.uint8), np.array([fname]))
    return table


def build_devkit(root: Path, nested: bool = False) -> Path:
    """The torchvision ``stanford_cars/`` folder (``nested``: Kaggle's ``cars_train/cars_train/``,
    ``car_devkit/devkit/``) with one image per class in each folder, the release's file names
    (``00001.jpg`` in both folders), under ``root``; returns the folder."""
    from scipy.io import savemat

    base = root / "stanford_cars"
    for folder, offset in (("cars_train", 0), ("cars_test", 1)):
        rows = []
        for label in range(1, 197):
            fname = f"{label:05d}.jpg"
            w, h = JPEG_SIZES[(label + offset) % len(JPEG_SIZES)]
            images = base / folder / folder if nested else base / folder
            write_jpeg(images / fname, w, h, seed=40_000 + 2 * label + offset)
            rows.append((label, fname))
        devkit = base / "car_devkit" / "devkit" if nested else base / "devkit"
        devkit.mkdir(parents=True, exist_ok=True)
        target = devkit / "cars_train_annos.mat" if folder == "cars_train" else base / "cars_test_annos_withlabels.mat"
        savemat(target, {"annotations": _annotations(rows)})
    names = np.empty((1, 196), dtype=object)
    for label in range(1, 197):
        names[0, label - 1] = np.array([f"Make{label} Model {label} 2012"])
    savemat(devkit / "cars_meta.mat", {"class_names": names})
    (devkit / "README.txt").write_text("devkit\n")
    return base


def zip_tree(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as zf:
        for file in sorted(folder.rglob("*")):
            zf.write(file, arcname=file.relative_to(folder.parent).as_posix())
    return archive


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cars_layouts")
    flat = build_devkit(out / "flat")
    nested = build_devkit(out / "nested", nested=True)
    return {
        "folder": flat,
        "zip": zip_tree(flat, out / "stanford_cars.zip"),
        "kaggle": zip_tree(nested, out / "kaggle.zip"),
    }


@pytest.fixture
def small_release(monkeypatch):
    """The published image counts, scaled to the test's 196 + 196 images (196 classes stay)."""
    monkeypatch.setattr(cars196, "PUBLISHED_IMAGES", {"cars_train": 196, "cars_test": 196})


def params(source: dict | None = None) -> cars196.Cars196Params:
    return cars196.Cars196Params.model_validate(
        {"source": source or {}, "image_size": 16, "split": {"scheme": "standard"}}
    )


def download_and_prepare(project: Path, source: dict | None = None, workers: int = 1) -> PreparedDataset:
    """What download@cars196 and prepare@cars196 run (their stage functions, at the data level)."""
    p = params(source)
    cars196.SPEC.fetch(p, project / "artifacts/raw/cars196", project / "data")
    prepare_dataset(
        cars196.SPEC, p, project / "artifacts/raw/cars196", project / "artifacts/prepared/cars196", workers=workers
    )
    return PreparedDataset.load(project / "artifacts/prepared/cars196")


def check_split(data: PreparedDataset) -> None:
    manifest = data.manifest
    assert set(manifest.label[manifest.split == "train"]) == set(range(1, 99))
    assert set(manifest.label[manifest.split == "test"]) == set(range(99, 197))
    assert len(manifest) == 392 and manifest.label.value_counts().eq(2).all()  # cars_train + cars_test images
    assert manifest.class_name[manifest.label == 5].iloc[0] == "Make5 Model 5 2012"
    assert data.images.shape[0] == 392 and (data.sizes.min(axis=1) == 16).all()


def test_layout_archive_downloaded_from_a_mirror_then_prepared(tmp_path, file_server, layouts, small_release, capsys):
    shutil.copy(layouts["zip"], file_server.root / "stanford_cars.zip")
    url = f"{file_server.url}/stanford_cars.zip"
    data = download_and_prepare(tmp_path, {"stanford_cars": {"url": url}})
    check_split(data)
    # both folders hold a 00001.jpg (the release's names): kept apart by their folder
    assert set(data.manifest.path[data.manifest.label == 1]) == {
        "stanford_cars/cars_train/00001.jpg",
        "stanford_cars/cars_test/00001.jpg",
    }
    assert set(data.manifest.path.str.split("/").str[1]) == {"cars_train", "cars_test"}
    # no md5 is published: the sha256 is recorded next to the file on first use, and said so
    record = (tmp_path / "data" / "stanford_cars.zip.sha256").read_text()
    archives = read_json(tmp_path / "artifacts/raw/cars196/archives.json")
    assert archives == [
        {"filename": "stanford_cars.zip", "url": url, "md5": archives[0]["md5"], "sha256": record.split()[0]}
    ]
    assert record == f"{archives[0]['sha256']}  stanford_cars.zip\n"
    err = capsys.readouterr().err
    assert "cars196: stanford_cars.zip has no published md5; its md5 is" in err
    assert "datasets.cars196.source.stanford_cars.md5" in err and "stanford_cars.zip.sha256" in err

    # a later, different copy under the same name fails in one line (the recorded one is the judge)
    replaced = tmp_path / "data" / "stanford_cars.zip"
    replaced.write_bytes(replaced.read_bytes() + b"\0")
    with pytest.raises(DataError) as error:
        cars196.SPEC.fetch(params(), tmp_path / "artifacts/raw/cars196", tmp_path / "data")
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(f"{replaced}: sha256 ")
    assert f"recorded on first use in {replaced}.sha256; restore that copy, or delete" in str(error.value)


def test_kaggle_nesting_and_the_release_pieces_in_the_dropbox(tmp_path, layouts, small_release):
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    shutil.copy(layouts["kaggle"], dropbox / "stanford_cars.zip")  # cars_train/cars_train/, car_devkit/devkit/
    # the workaround of pytorch/vision#7545: the devkit and the test labels beside the Kaggle zip
    with tarfile.open(dropbox / "car_devkit.tgz", "w:gz") as tar:
        tar.add(layouts["folder"] / "devkit", arcname="devkit")
    shutil.copy(layouts["folder"] / "cars_test_annos_withlabels.mat", dropbox)
    check_split(download_and_prepare(tmp_path, workers=2))
    assert {p.name for p in dropbox.glob("*.sha256")} == {
        "stanford_cars.zip.sha256",
        "car_devkit.tgz.sha256",
        "cars_test_annos_withlabels.mat.sha256",
    }


def test_torchvision_folder_in_the_dropbox(tmp_path, layouts, small_release):
    shutil.copytree(layouts["folder"], tmp_path / "data" / "stanford_cars")
    data = download_and_prepare(tmp_path)
    check_split(data)
    recorded = (tmp_path / "data" / "stanford_cars.sha256").read_text()
    assert recorded.endswith("  stanford_cars/\n")
    assert read_json(tmp_path / "artifacts/raw/cars196/archives.json")[0]["sha256"] == recorded.split()[0]
    (tmp_path / "data/stanford_cars/cars_test/00007.jpg").write_bytes(b"changed")
    with pytest.raises(DataError, match=r"stanford_cars: sha256 [0-9a-f]{64} differs from [0-9a-f]{64} recorded"):
        cars196.SPEC.fetch(params(), tmp_path / "artifacts/raw/cars196", tmp_path / "data")


def test_the_published_counts_are_checked(tmp_path, layouts):
    (tmp_path / "data").mkdir()
    shutil.copy(layouts["zip"], tmp_path / "data" / "stanford_cars.zip")
    with pytest.raises(
        DataError,
        match=r"^cars196: cars_train_annos.mat lists 196 images, the published release has 8,144 in cars_train/ "
        r"\(16,185 in all\)",
    ):
        cars196.SPEC.fetch(params(), tmp_path / "raw", tmp_path / "data")
    assert not (tmp_path / "raw").exists() and not list((tmp_path / "data").glob("*.sha256"))


def test_a_listed_image_missing_from_the_folders_is_named(tmp_path, layouts, small_release):
    folder = tmp_path / "data" / "stanford_cars"
    shutil.copytree(layouts["folder"], folder)
    (folder / "cars_test" / "00042.jpg").unlink()
    with pytest.raises(
        DataError, match=r"^cars196: 1 listed image\(s\) are missing, e.g. stanford_cars/cars_test/00042"
    ):
        cars196.SPEC.fetch(params(), tmp_path / "raw", tmp_path / "data")
    assert not list((tmp_path / "data").glob("*.sha256"))  # a copy that failed its check is not recorded
    shutil.rmtree(folder / "devkit")
    with pytest.raises(DataError, match=r"^cars196: no cars_meta.mat in the Kaggle/torchvision files; the layout"):
        cars196.SPEC.fetch(params(), tmp_path / "raw", tmp_path / "data")


def test_nothing_in_the_dropbox_is_one_short_line(tmp_path):
    dropbox = tmp_path / "data"
    dropbox.mkdir()

    def never(url):
        pytest.fail(f"no URL to check, yet {url} was")

    (line,) = dataset_problems(cars196.SPEC, params(), dropbox, never)
    assert line == (
        f"cars196: place stanford_cars.zip (the Kaggle/torchvision layout) or car_ims.tgz + cars_annos.mat in "
        f"{dropbox}/; no public download since 2023 (docs/datasets.md#cars196-layouts)"
    )
    with pytest.raises(DataError) as error:
        cars196.SPEC.fetch(params(), tmp_path / "raw", dropbox)
    assert str(error.value) == line and len(line.replace(str(dropbox), "data")) < 200
    # half of the Stanford layout: the other file, in one line
    (dropbox / "car_ims.tgz").write_bytes(b"x")
    (line,) = dataset_problems(cars196.SPEC, params(), dropbox, never)
    assert line.startswith(
        f"cars196: cars_annos.mat (md5 b407c6086d669747186bd1d764ff9dbc) is not in {dropbox}/ and has no "
        "public download"
    )
    assert len(line.replace(str(dropbox), "data")) < 200
    # any file of the Kaggle/torchvision layout: the download stage checks its content
    (dropbox / "car_ims.tgz").unlink()
    (dropbox / "cars_test_annos_withlabels.mat").write_bytes(b"x")
    assert dataset_problems(cars196.SPEC, params(), dropbox, never) == []


def test_preflight_checks_the_layout_mirror(tmp_path):
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    checked = []
    source = {"stanford_cars": {"url": "https://mirror.example.org/stanford_cars.zip"}}
    assert dataset_problems(cars196.SPEC, params(source), dropbox, lambda url: checked.append(url)) == []
    (line,) = dataset_problems(cars196.SPEC, params(source), dropbox, lambda url: "HTTP 404 Not Found")
    assert checked == [source["stanford_cars"]["url"]]
    assert line == (
        f"cars196: stanford_cars.zip cannot be downloaded (mirror.example.org: HTTP 404 Not Found); place it in "
        f"{dropbox}/ (or set datasets.cars196.source.stanford_cars.url to a mirror)"
    )
