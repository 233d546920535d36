"""CARS196 from every layout its files come in (tests/helpers/fabricate.py builds each as published):
Kaggle's jessicali9530 images with the devkit and the labelled test annotations (under each of
their names) or with Kaggle's meta download, Kaggle's jutrera class folders (what
pytorch-metric-learning downloads), torchvision's folder, the classification release's pieces,
a ``stanford_cars.zip`` from a mirror; the DML split rebuilt (classes 1-98 / 99-196), the
sha256 recorded only once the content passed; the one-line errors of the incomplete layouts and
the precedence between layouts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.fabricate import CAR_LABELS, ODD_NAME, CarsRelease, car_name, error_lines, run_stage

from dmlbench.data import cars196
from dmlbench.data.archives import dataset_problems
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.prepare import prepare_dataset
from dmlbench.errors import DataError
from dmlbench.io import read_json

KAGGLE_IMAGES = "stanford-cars-dataset.zip"  # `kaggle datasets download -d jessicali9530/stanford-cars-dataset`
KAGGLE_META = "standford-cars-dataset-meta.zip"  # `... -d abdelrahmant11/standford-cars-dataset-meta`
CLASS_FOLDERS = "stanford-car-dataset-by-classes-folder"  # jutrera's; PML saves it without .zip


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> CarsRelease:
    return CarsRelease(tmp_path_factory.mktemp("cars"))


@pytest.fixture(scope="module")
def files(release, tmp_path_factory) -> dict[str, Path]:
    """Each file as its source publishes it (the Kaggle downloads under the Kaggle CLI's names)."""
    out = tmp_path_factory.mktemp("cars_files")
    return {
        KAGGLE_IMAGES: release.kaggle_images_zip(out / KAGGLE_IMAGES),
        KAGGLE_META: release.kaggle_meta_zip(out / KAGGLE_META),
        "meta_without_folder": release.kaggle_meta_zip(out / "meta_without_folder.zip", with_folder=False),
        "car_devkit.tgz": release.car_devkit_tgz(out / "car_devkit.tgz"),
        "cars_train.tgz": release.release_tgz("cars_train", out / "cars_train.tgz"),
        "cars_test.tgz": release.release_tgz("cars_test", out / "cars_test.tgz"),
        "cars_test_annos_withlabels.mat": release.withlabels,
        "cars_annos.mat": release.cars_annos,
        f"{CLASS_FOLDERS}.zip": release.class_folders_zip(out / f"{CLASS_FOLDERS}.zip"),
    }


def place(dropbox: Path, files: dict[str, Path], names: dict[str, str]) -> None:
    """Copy ``files[key]`` to ``dropbox/<name>`` for each ``name: key``."""
    dropbox.mkdir(parents=True, exist_ok=True)
    for name, key in names.items():
        shutil.copy(files[key], dropbox / name)


def params(source: dict | None = None, **entry) -> cars196.Cars196Params:
    source = {"allow_subset": True, **(source or {})}  # 20 of the 16,185 images
    return cars196.Cars196Params.model_validate(
        {"source": source, "image_size": 16, "split": {"scheme": "standard"}, **entry}
    )


def download_and_prepare(project: Path, p: cars196.Cars196Params | None = None) -> PreparedDataset:
    """What download@cars196 and prepare@cars196 run (their stage functions, at the data level)."""
    p = p or params()
    cars196.SPEC.fetch(p, project / "artifacts/raw/cars196", project / "data")
    prepare_dataset(
        cars196.SPEC, p, project / "artifacts/raw/cars196", project / "artifacts/prepared/cars196", workers=1
    )
    return PreparedDataset.load(project / "artifacts/prepared/cars196")


def check_split(data: PreparedDataset) -> None:
    manifest = data.manifest
    assert set(manifest.label[manifest.split == "train"]) == {label for label in CAR_LABELS if label <= 98}
    assert set(manifest.label[manifest.split == "test"]) == {label for label in CAR_LABELS if label > 98}
    assert len(manifest) == 20 and manifest.label.value_counts().eq(2).all()  # cars_train + cars_test images
    assert manifest.class_name[manifest.label == 5].iloc[0] == "Make5 Model 5 2012"
    assert manifest.class_name[manifest.label == ODD_NAME].iloc[0] == car_name(ODD_NAME)  # the name keeps its '/'
    assert data.images.shape[0] == 20 and (data.sizes.min(axis=1) == 16).all()
    assert data.info["counts"]["subset"] and data.info["counts"]["published"]["images"] == 16_185


def recorded(dropbox: Path) -> set[str]:
    return {p.name for p in dropbox.glob("*.sha256")}


# --------------------------------------------------------------------------- each route


@pytest.mark.parametrize("labels", ["cars_test_annos_withlabels.mat", "cars_test_annos_withlabels (1).mat"])
def test_kaggle_images_with_the_devkit_and_the_labelled_test_file(tmp_path, files, labels):
    names = {KAGGLE_IMAGES: KAGGLE_IMAGES, "car_devkit.tgz": "car_devkit.tgz", labels: "cars_test_annos_withlabels.mat"}
    place(tmp_path / "data", files, names)
    data = download_and_prepare(tmp_path)
    check_split(data)
    assert set(data.manifest.path.str.rsplit("/", n=1).str[0]) == {"cars_train/cars_train", "cars_test/cars_test"}
    assert recorded(tmp_path / "data") == {f"{name}.sha256" for name in names}


@pytest.mark.parametrize("with_folder", [True, False], ids=["devkit-folder", "devkit-tgz-only"])
def test_kaggle_images_with_the_kaggle_meta_download(tmp_path, files, with_folder):
    meta = KAGGLE_META if with_folder else "meta_without_folder"
    place(tmp_path / "data", files, {KAGGLE_IMAGES: KAGGLE_IMAGES, KAGGLE_META: meta})
    check_split(download_and_prepare(tmp_path))
    assert recorded(tmp_path / "data") == {f"{KAGGLE_IMAGES}.sha256", f"{KAGGLE_META}.sha256"}


@pytest.mark.parametrize("name", [f"{CLASS_FOLDERS}.zip", CLASS_FOLDERS])
def test_kaggle_class_folders_as_pytorch_metric_learning_downloads_them(tmp_path, files, name):
    place(tmp_path / "data", files, {name: f"{CLASS_FOLDERS}.zip"})
    data = download_and_prepare(tmp_path)
    check_split(data)
    odd = data.manifest.path[data.manifest.label == ODD_NAME]
    assert set(odd) == {
        f"car_data/car_data/train/Ram C-V Cargo Van Minivan {ODD_NAME}/{ODD_NAME:05d}.jpg",
        f"car_data/car_data/test/Ram C-V Cargo Van Minivan {ODD_NAME}/{ODD_NAME:05d}.jpg",
    }
    assert recorded(tmp_path / "data") == {f"{name}.sha256"}


def test_kaggle_class_folders_unpacked(tmp_path, files):
    import zipfile

    with zipfile.ZipFile(files[f"{CLASS_FOLDERS}.zip"]) as zf:
        zf.extractall(tmp_path / "data" / CLASS_FOLDERS)
    check_split(download_and_prepare(tmp_path))
    assert (tmp_path / "data" / f"{CLASS_FOLDERS}.sha256").read_text().endswith(f"  {CLASS_FOLDERS}/\n")


def test_the_classification_release_pieces(tmp_path, files):
    names = ("car_devkit.tgz", "cars_train.tgz", "cars_test.tgz", "cars_test_annos_withlabels.mat")
    place(tmp_path / "data", files, {name: name for name in names})
    check_split(download_and_prepare(tmp_path))
    assert recorded(tmp_path / "data") == {f"{name}.sha256" for name in names}


def test_torchvision_folder_in_the_dropbox(tmp_path, release):
    release.torchvision_folder(tmp_path / "data" / "stanford_cars")
    data = download_and_prepare(tmp_path)
    check_split(data)
    record = (tmp_path / "data" / "stanford_cars.sha256").read_text()
    assert record.endswith("  stanford_cars/\n")
    assert read_json(tmp_path / "artifacts/raw/cars196/archives.json")[0]["sha256"] == record.split()[0]
    (tmp_path / "data/stanford_cars/cars_test/00005.jpg").write_bytes(b"changed")
    with pytest.raises(DataError, match=r"stanford_cars: sha256 [0-9a-f]{64} differs from [0-9a-f]{64} recorded"):
        cars196.SPEC.fetch(params(), tmp_path / "artifacts/raw/cars196", tmp_path / "data")


def test_the_layout_zip_downloaded_from_a_mirror(tmp_path, file_server, release, capsys):
    release.torchvision_folder(tmp_path / "layout" / "stanford_cars")
    shutil.make_archive(str(file_server.root / "stanford_cars"), "zip", tmp_path / "layout", "stanford_cars")
    url = f"{file_server.url}/stanford_cars.zip"
    check_split(download_and_prepare(tmp_path, params({"stanford_cars": {"url": url}})))
    record = (tmp_path / "data" / "stanford_cars.zip.sha256").read_text()
    archives = read_json(tmp_path / "artifacts/raw/cars196/archives.json")
    assert archives == [
        {"filename": "stanford_cars.zip", "url": url, "md5": archives[0]["md5"], "sha256": record.split()[0]}
    ]
    err = capsys.readouterr().err
    assert "cars196: stanford_cars.zip has no published md5; its md5 is" in err
    assert "datasets.cars196.source.stanford_cars.md5" in err
    replaced = tmp_path / "data" / "stanford_cars.zip"
    replaced.write_bytes(replaced.read_bytes() + b"\0")
    with pytest.raises(DataError) as error:
        cars196.SPEC.fetch(params(), tmp_path / "artifacts/raw/cars196", tmp_path / "data")
    assert "\n" not in str(error.value) and str(error.value).startswith(f"{replaced}: sha256 ")


# --------------------------------------------------------------------------- incomplete layouts, precedence


def test_the_kaggle_images_alone_say_where_the_devkit_comes_from(tmp_path, files):
    """The Kaggle download renamed as docs once said: one line naming the devkit's sources, the
    user-error exit status, nothing recorded."""
    place(tmp_path / "data", files, {KAGGLE_IMAGES: KAGGLE_IMAGES})
    code, err = run_stage(tmp_path, "download", "cars196", {"source": {}})
    assert code == 2 and error_lines(err) == [
        f"error: cars196: {KAGGLE_IMAGES}: no devkit (devkit/cars_meta.mat, devkit/cars_train_annos.mat): Kaggle's "
        "jessicali9530/stanford-cars-dataset (as stanford-cars-dataset.zip) holds the images only; add "
        "car_devkit.tgz (https://github.com/pytorch/vision/files/11644847/car_devkit.tgz) or Kaggle's "
        "abdelrahmant11/standford-cars-dataset-meta (as standford-cars-dataset-meta.zip)"
    ]
    assert not recorded(tmp_path / "data") and not (tmp_path / "artifacts/raw/cars196").exists()


def test_the_devkit_without_the_labelled_test_file_names_where_it_comes_from(tmp_path, files):
    place(tmp_path / "data", files, {KAGGLE_IMAGES: KAGGLE_IMAGES, "car_devkit.tgz": "car_devkit.tgz"})
    code, err = run_stage(tmp_path, "download", "cars196", {"source": {}})
    (line,) = error_lines(err)
    assert code == 2 and line.startswith(
        f"error: cars196: {KAGGLE_IMAGES} + car_devkit.tgz: no labelled test annotations cars_test_annos_withlabels.mat"
    )
    assert "'cars_test_annos_withlabels (1).mat' of Kaggle's abdelrahmant11/standford-cars-dataset-meta" in line
    assert "pytorch/vision#7545, comment 1631441616" in line
    assert not recorded(tmp_path / "data") and not (tmp_path / "artifacts/raw/cars196").exists()


def test_a_stray_cars_annos_mat_does_not_switch_the_layout(tmp_path, files, capsys):
    """Kaggle's zip holds a cars_annos.mat that users copy beside it: the Kaggle files are used and
    one line says the .mat is ignored."""
    names = {
        KAGGLE_IMAGES: KAGGLE_IMAGES,
        KAGGLE_META: KAGGLE_META,
        "cars_annos.mat": "cars_annos.mat",
    }
    place(tmp_path / "data", files, names)
    check_split(download_and_prepare(tmp_path))
    notes = [line for line in capsys.readouterr().err.splitlines() if "ignored" in line]
    assert notes == [
        f"cars196: using the devkit layout ({KAGGLE_IMAGES}, {KAGGLE_META}); ignored in {tmp_path / 'data'}/: "
        "cars_annos.mat (the Stanford layout needs car_ims.tgz beside it) (precedence: "
        "docs/datasets.md#cars196-layouts)"
    ]
    assert "cars_annos.mat.sha256" not in recorded(tmp_path / "data")


def test_the_stanford_files_come_first_and_say_what_they_ignore(tmp_path, files, real_format_archives, capsys):
    place(tmp_path / "data", files, {f"{CLASS_FOLDERS}.zip": f"{CLASS_FOLDERS}.zip"})
    for path in real_format_archives["cars196"]["files"]:
        shutil.copy(path, tmp_path / "data" / path.name)
    md5 = real_format_archives["cars196"]["md5"]
    source = {"images": {"md5": md5["car_ims.tgz"]}, "annotations": {"md5": md5["cars_annos.mat"]}}
    data = download_and_prepare(tmp_path, params(source))
    assert data.manifest.path.str.startswith("car_ims/").all() and len(data.manifest) == 392
    assert f"ignored in {tmp_path / 'data'}/: {CLASS_FOLDERS}.zip (precedence:" in capsys.readouterr().err


def test_a_listed_image_missing_is_counted_not_dropped(tmp_path, release, capsys):
    """Download says it and records nothing; prepare refuses it in one line, or with skip_corrupt
    leaves it out, counted apart, and the count check adds it back."""
    folder = release.torchvision_folder(tmp_path / "data" / "stanford_cars")
    (folder / "cars_test" / "00097.jpg").unlink()
    raw, prepared = tmp_path / "artifacts/raw/cars196", tmp_path / "artifacts/prepared/cars196"
    cars196.SPEC.fetch(params(), raw, tmp_path / "data")
    err = capsys.readouterr().err
    assert "cars196: 1 listed image(s) not in stanford_cars/ (stanford_cars/cars_test/00097.jpg) (the .mat files" in err
    assert "no sha256 is recorded for an incomplete copy" in err and not recorded(tmp_path / "data")
    with pytest.raises(DataError) as error:
        prepare_dataset(cars196.SPEC, params(), raw, prepared, workers=1)
    assert str(error.value) == (
        f"cars196: 1 listed image(s) not in {raw} (stanford_cars/cars_test/00097.jpg): the archive lacks them; "
        "set datasets.cars196.skip_corrupt: true to leave them out (counted)"
    )
    info = prepare_dataset(cars196.SPEC, params(skip_corrupt=True), raw, prepared, workers=1)
    assert info["num_images"] == 19 and info["skipped"] == [
        {"path": "stanford_cars/cars_test/00097.jpg", "error": "listed but not in the archive"}
    ]
    assert info["counts"]["left_out"] == {"missing": 1, "unreadable": 0}
    assert info["counts"]["listed"]["images"] == 20 and info["counts"]["prepared"]["images"] == 19
    assert "cars196: 1 listed image(s) left out (skip_corrupt: true): 1 not in the archive, 0 unreadable" in (
        capsys.readouterr().err
    )


# --------------------------------------------------------------------------- pre-flight


def test_nothing_in_the_dropbox_is_one_short_line(tmp_path):
    dropbox = tmp_path / "data"
    dropbox.mkdir()

    def never(url):
        pytest.fail(f"no URL to check, yet {url} was")

    (line,) = dataset_problems(cars196.SPEC, params(), dropbox, never)
    assert line == cars196.nothing_there(dropbox) and line.startswith(f"cars196: no Cars196 files in {dropbox}/ ")
    with pytest.raises(DataError) as error:
        cars196.SPEC.fetch(params(), tmp_path / "raw", dropbox)
    assert str(error.value) == line
    (dropbox / "car_ims.tgz").write_bytes(b"x")  # half of the Stanford layout: the other file, in one line
    (line,) = dataset_problems(cars196.SPEC, params(), dropbox, never)
    assert line.startswith(
        f"cars196: cars_annos.mat (md5 b407c6086d669747186bd1d764ff9dbc) is not in {dropbox}/ and has no public "
        "download"
    )
    (dropbox / "car_ims.tgz").unlink()  # any file of another layout: the download stage checks its content
    (dropbox / "cars_test_annos_withlabels (1).mat").write_bytes(b"x")
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
