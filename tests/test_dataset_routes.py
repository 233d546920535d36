"""docs/datasets.md's routes followed literally: for each ``Files in `data/`:`` line of its
"Routes" section, the files fabricated in their published layouts (tests/helpers/fabricate.py) are placed
under exactly those names (the steps the route shows performed as written: the Kaggle client's
file names, In-Shop's unzip-and-zip-again), and the real download and prepare stage scripts run."""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import pytest
from helpers.fabricate import CarsRelease, highres_zip, run_stage
from helpers.project import ROOT

from dmlbench.data.cache import PreparedDataset
from dmlbench.io import md5_file

DOCS = ROOT / "docs" / "datasets.md"
SECTIONS = {
    "CUB-200-2011": "cub200",
    "Stanford Online Products": "sop",
    "In-Shop": "inshop",
    "Cars196 layouts": "cars196",
}


def documented_routes() -> list[tuple[str, str, list[str], str]]:
    """(dataset, route heading, the files in data/, the route's text) for each ``Files in `data/`:`` line."""
    text = DOCS.read_text()
    routes = text[text.index("## Routes: the files each dataset takes") :]
    routes = routes[: routes.index("\nAdding a dataset")]
    found, dataset, heading, start = [], None, "", 0
    for match in re.finditer(r"^(#{3,4}) (.+)$|^Files in `data/`: (.+)$", routes, flags=re.M):
        if match[1] == "###":
            dataset, heading, start = SECTIONS[match[2]], match[2], match.end()
        elif match[1]:
            heading, start = match[2], match.end()
        else:
            names = re.findall(r"`([^`]+)`", match[3])
            found.append((dataset, f"{dataset}: {heading} ({', '.join(names)})", names, routes[start : match.start()]))
            start = match.end()
    return found


ROUTES = documented_routes()


def test_the_docs_name_a_route_for_every_layout():
    names = {name for _, _, files, _ in ROUTES for name in files}
    assert {"CUB_200_2011.tgz", "Stanford_Online_Products.zip", "img.zip", "img_highres.zip"} <= names
    assert {"car_ims.tgz", "stanford-cars-dataset.zip", "standford-cars-dataset-meta.zip", "stanford_cars/"} <= names
    assert {"stanford-car-dataset-by-classes-folder.zip", "cars_test_annos_withlabels (1).mat"} <= names
    assert {dataset for dataset, *_ in ROUTES} == set(SECTIONS.values())


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> CarsRelease:
    return CarsRelease(tmp_path_factory.mktemp("cars"))


def kaggle_names(text: str) -> list[str]:
    """The files the route's ``kaggle datasets download -d <owner>/<dataset> -p data/`` commands save."""
    return [f"{slug}.zip" for slug in re.findall(r"kaggle datasets download -d [^/\s]+/(\S+) -p data/", text)]


def make(name: str, project: Path, release: CarsRelease, archives: dict, text: str) -> None:
    """Put the file ``name`` in ``project/data`` as the route says to."""
    dropbox = project / "data"
    target = dropbox / name
    given = {p.name: p for entry in archives.values() for p in entry["files"]}
    cars = {
        "stanford-cars-dataset.zip": release.kaggle_images_zip,
        "standford-cars-dataset-meta.zip": release.kaggle_meta_zip,
        "car_devkit.tgz": release.car_devkit_tgz,
        "cars_train.tgz": lambda path: release.release_tgz("cars_train", path),
        "cars_test.tgz": lambda path: release.release_tgz("cars_test", path),
        "stanford-car-dataset-by-classes-folder.zip": release.class_folders_zip,
    }
    if name == "img_highres.zip":  # the route's two commands, as written, on the encrypted release file
        assert "unzip -P '<password>' ~/Downloads/img_highres.zip" in text
        assert "zip -r -0 data/img_highres.zip img_highres" in text
        (project / "downloads").mkdir(exist_ok=True)
        encrypted = highres_zip(given["img.zip"], project / "downloads" / "img_highres.zip", password=b"secret")
        with zipfile.ZipFile(encrypted) as zf:  # unzip -P '<password>' ...: creates img_highres/
            zf.extractall(project, pwd=b"secret")
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zf:  # zip -r -0 data/img_highres.zip img_highres
            for file in sorted((project / "img_highres").rglob("*")):
                zf.write(file, file.relative_to(project).as_posix())
        shutil.rmtree(project / "img_highres")  # rm -r img_highres
    elif name in given:
        shutil.copy(given[name], target)
    elif name in cars:
        cars[name](target)
    elif name.startswith("cars_test_annos_withlabels"):
        shutil.copy(release.withlabels, target)
    elif name == "stanford_cars/":
        release.torchvision_folder(dropbox / "stanford_cars")
    elif name == "stanford_cars.zip":
        release.torchvision_folder(project / "layout" / "stanford_cars")
        shutil.make_archive(str(dropbox / "stanford_cars"), "zip", project / "layout", "stanford_cars")
    else:
        pytest.fail(f"docs/datasets.md names {name!r}, which no fabricated file stands for")


@pytest.mark.parametrize("dataset, route, names, text", ROUTES, ids=[route for _, route, _, _ in ROUTES])
def test_each_documented_route_downloads_and_prepares(
    dataset, route, names, text, tmp_path, release, real_format_archives
):
    assert set(kaggle_names(text)) <= set(names), "a Kaggle command of the route saves a file its list lacks"
    (tmp_path / "data").mkdir()
    for name in names:
        make(name, tmp_path, release, real_format_archives, text)
    source: dict = {"allow_subset": True}  # small fabricated copies
    pins = {"cub200": ("archive", "CUB_200_2011.tgz"), "sop": ("archive", "Stanford_Online_Products.zip")}
    if dataset in pins:  # not the release's bytes: their md5 pinned, as for a mirror
        key, name = pins[dataset]
        source[key] = {"md5": md5_file(tmp_path / "data" / name)}
    if "car_ims.tgz" in names:
        for key, name in (("images", "car_ims.tgz"), ("annotations", "cars_annos.mat")):
            source[key] = {"md5": md5_file(tmp_path / "data" / name)}
    entry = {"source": source, "image_size": 16, "split": {"scheme": "standard"}}
    for stage in ("download", "prepare"):
        code, err = run_stage(tmp_path, stage, dataset, entry)
        assert code == 0, err[-3000:]
    data = PreparedDataset.load(tmp_path / "artifacts/prepared" / dataset)
    assert data.info["counts"]["subset"] and data.info["skipped"] == []
    assert len(data.manifest) == data.info["counts"]["listed"]["images"] > 0
    if dataset == "inshop":
        folder = "img_highres/" if "img_highres.zip" in names else "img/"
        assert data.manifest.path.str.startswith(folder).all()
