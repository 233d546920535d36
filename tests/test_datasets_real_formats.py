"""CUB-200-2011, CARS196, SOP and In-Shop end to end on small archives in their exact formats:
the download and prepare stage functions users run (HTTP from 127.0.0.1, the data/ drop-box),
official class-disjoint splits, split schemes, manifests, the cache, and the errors."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers.project import ROOT

from dmlbench.data import DATASETS
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.stage import download_stage, prepare_stage
from dmlbench.errors import DataError
from dmlbench.io import md5_file, read_json
from dmlbench.params.load import parse_params


def make_params(base: dict, dataset: str, source: dict, split: dict | None = None, **entry):
    """params.yaml with ``dataset`` alone; these small archives are deliberate subsets (``allow_subset``)."""
    raw = copy.deepcopy(base)
    source = {"allow_subset": True, **source}
    raw["datasets"] = {dataset: {"source": source, "image_size": 16, "split": split or {"scheme": "standard"}, **entry}}
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "published"  # a 'standard' split has no validation classes
    raw["tuning"]["baselines"] = []  # nothing to compare a published grid with
    return parse_params(raw)


def serve(file_server, archives: dict, dataset: str) -> dict:
    for path in archives[dataset]["files"]:
        shutil.copy(path, file_server.root / path.name)
    return archives[dataset]["md5"]


def place_in_dropbox(project: Path, archives: dict, dataset: str) -> None:
    (project / "data").mkdir(exist_ok=True)
    for path in archives[dataset]["files"]:
        shutil.copy(path, project / "data" / path.name)


def classes(manifest: pd.DataFrame, split: str) -> set[int]:
    return set(manifest.label[manifest.split == split])


def check_cache(data: PreparedDataset, image_size: int = 16) -> None:
    """Short side = image_size, long side <= canvas, padding zero, manifest aligned with the arrays."""
    canvas = int(np.ceil(image_size * 4 / 3))
    assert data.images.shape == (len(data.manifest), canvas, canvas, 3) and data.images.dtype == np.uint8
    assert (data.sizes.min(axis=1) == image_size).all() and (data.sizes.max(axis=1) <= canvas).all()
    for row in range(0, len(data.manifest), 7):
        h, w = data.sizes[row]
        assert not data.images[row, h:].any() and not data.images[row, :, w:].any()
        assert data.images[row, :h, :w].any()


def test_cub200_download_resumes_and_prepare_splits_by_class(
    in_project, file_server, real_format_archives, default_raw_params, fast_retries
):
    md5 = serve(file_server, real_format_archives, "cub200")["CUB_200_2011.tgz"]
    url = f"{file_server.url}/drop/CUB_200_2011.tgz"
    params = make_params(default_raw_params, "cub200", {"archive": {"url": url, "md5": md5}})
    download_stage("cub200", params.datasets["cub200"])

    # The archive was resumed with a Range request and saved, verified, in the drop-box.
    assert [r for r in file_server.requests] == [
        ("/drop/CUB_200_2011.tgz", None),
        ("/drop/CUB_200_2011.tgz", f"bytes={(real_format_archives['cub200']['files'][0].stat().st_size) // 2}-"),
    ]
    assert md5_file(in_project / "data" / "CUB_200_2011.tgz") == md5
    assert sorted(p.name for p in (in_project / "data").iterdir()) == ["CUB_200_2011.tgz"]
    raw = in_project / "artifacts" / "raw" / "cub200"
    assert (raw / "CUB_200_2011" / "images.txt").exists() and (raw / "attributes.txt").exists()
    assert read_json(raw / "archives.json") == [{"filename": "CUB_200_2011.tgz", "md5": md5, "url": url}]

    info = prepare_stage("cub200", params.datasets["cub200"], workers=2)
    manifest = pd.read_csv(in_project / "artifacts/prepared/cub200/manifest.csv", keep_default_na=False)
    assert list(manifest.columns) == ["path", "label", "class_name", "split", "fold"]
    # Classes 1-100 train, 101-200 test (not train_test_split.txt, which mixes every class).
    assert classes(manifest, "train") == set(range(1, 101)) and classes(manifest, "test") == set(range(101, 201))
    assert info["splits"] == {"train": {"images": 200, "classes": 100}, "test": {"images": 200, "classes": 100}}
    assert manifest.class_name[manifest.label == 17].iloc[0] == "017.Bird_17"
    assert (manifest.fold == "").all() and info["archives"][0]["md5"] == md5
    data = PreparedDataset.load(in_project / "artifacts/prepared/cub200", in_memory=False)
    check_cache(data)
    # Grayscale JPEGs become RGB with equal channels (image ids divisible by 3 are grayscale).
    gray = data.manifest.path.str.extract(r"_(\d+)\.jpg$")[0].astype(int) % 3 == 0
    row = int(np.flatnonzero(gray)[0])
    h, w = data.sizes[row]
    pixels = data.images[row, :h, :w].astype(int)
    assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()
    # Non-square: a 24 x 18 (w x h) photo -> 21 x 16; a 40 x 16 one -> long side cropped to 22.
    assert {tuple(s) for s in data.sizes.tolist()} == {(16, 21), (21, 16), (16, 16), (16, 22)}


def test_cub200_rc_cv_folds_in_the_manifest(in_project, real_format_archives, default_raw_params):
    md5 = real_format_archives["cub200"]["md5"]["CUB_200_2011.tgz"]
    place_in_dropbox(in_project, real_format_archives, "cub200")
    params = make_params(default_raw_params, "cub200", {"archive": {"md5": md5}}, split={"scheme": "rc_cv"})
    download_stage("cub200", params.datasets["cub200"])
    info = prepare_stage("cub200", params.datasets["cub200"], workers=1)
    data = PreparedDataset.load(in_project / "artifacts/prepared/cub200")
    assert data.num_folds == info["num_folds"] == 4
    expected = [range(76, 101), range(1, 26), range(26, 51), range(51, 76)]  # MLRC val blocks, 1-based ids
    for fold, block in enumerate(expected):
        assert set(data.split("val", fold=fold).labels) == set(block)
        assert set(data.split("train", fold=fold).labels) == set(range(1, 101)) - set(block)
        assert info["folds"][fold] == {"train": {"images": 150, "classes": 75}, "val": {"images": 50, "classes": 25}}
    assert not set(data.split("test").labels) & set(range(1, 101))


def test_cars196_without_files_is_one_line_naming_the_layouts(in_project, default_raw_params):
    params = make_params(default_raw_params, "cars196", {})
    with pytest.raises(DataError) as error:
        download_stage("cars196", params.datasets["cars196"])
    assert str(error.value) == (
        "cars196: no Cars196 files in data/ (no public download since 2023): place those of one route of "
        "docs/datasets.md#cars196-layouts there, e.g. car_ims.tgz + cars_annos.mat, or Kaggle's "
        "stanford-cars-dataset.zip + standford-cars-dataset-meta.zip"
    )
    (in_project / "data").mkdir()
    (in_project / "data" / "car_ims.tgz").write_bytes(b"x")  # half of the Stanford layout
    with pytest.raises(DataError) as error:
        download_stage("cars196", params.datasets["cars196"])
    assert str(error.value).startswith(
        "cars196: cars_annos.mat (md5 b407c6086d669747186bd1d764ff9dbc) is not in data/ and has no public download"
    )
    assert "\n" not in str(error.value) and not (in_project / "artifacts").exists()


def test_cars196_layout_zip_through_the_download_and_prepare_stages(
    in_project, file_server, default_raw_params, tmp_path_factory
):
    from helpers.fabricate import CAR_LABELS, CarsRelease

    out = tmp_path_factory.mktemp("layout")
    CarsRelease(out).torchvision_folder(out / "stanford_cars")
    shutil.make_archive(str(file_server.root / "stanford_cars"), "zip", out, "stanford_cars")
    source = {"stanford_cars": {"url": f"{file_server.url}/drop/stanford_cars.zip"}}
    params = make_params(default_raw_params, "cars196", source, split={"scheme": "rc_cv"})
    download_stage("cars196", params.datasets["cars196"])
    assert [range_ for _, range_ in file_server.requests][1].startswith("bytes=")  # resumed
    assert (in_project / "data" / "stanford_cars.zip.sha256").exists()
    prepare_stage("cars196", params.datasets["cars196"], workers=1)
    data = PreparedDataset.load(in_project / "artifacts/prepared/cars196")
    assert classes(data.manifest, "train") | classes(data.manifest, "test") == set(CAR_LABELS)
    assert max(classes(data.manifest, "train")) <= 98 < min(classes(data.manifest, "test"))
    assert data.manifest.path.str.startswith("stanford_cars/cars_t").all() and len(data.manifest) == 20
    check_cache(data)


def test_cars196_from_the_dropbox_with_rc_cv(in_project, real_format_archives, default_raw_params):
    md5 = real_format_archives["cars196"]["md5"]
    place_in_dropbox(in_project, real_format_archives, "cars196")
    # The published md5s are checked: these test files are not the real release.
    with pytest.raises(
        DataError, match=r"data/car_ims.tgz: md5 is [0-9a-f]{32}, expected d5c8f0aa497503f355e17dc7886c3f14; replace it"
    ):
        download_stage("cars196", make_params(default_raw_params, "cars196", {}).datasets["cars196"])
    source = {"images": {"md5": md5["car_ims.tgz"]}, "annotations": {"md5": md5["cars_annos.mat"]}}
    params = make_params(default_raw_params, "cars196", source, split={"scheme": "rc_cv"})
    download_stage("cars196", params.datasets["cars196"])
    prepare_stage("cars196", params.datasets["cars196"], workers=1)
    data = PreparedDataset.load(in_project / "artifacts/prepared/cars196")
    manifest = data.manifest
    assert classes(manifest, "train") == set(range(1, 99)) and classes(manifest, "test") == set(range(99, 197))
    assert len(manifest) == 392 and manifest.path.str.startswith("car_ims/").all()
    assert manifest.class_name[manifest.label == 5].iloc[0] == "Make5 Model 5 2012"
    validating = set().union(*(set(data.split("val", fold=f).labels) for f in range(4)))
    assert set(range(1, 99)) - validating == {25, 74}  # the rounding quirk of MLRCSplitManager
    assert (manifest.fold[manifest.label.isin([25, 74])] == "").all()
    check_cache(data)


def test_sop_retries_a_failing_server_and_splits_by_ebay_files(
    in_project, file_server, real_format_archives, default_raw_params, fast_retries
):
    md5 = serve(file_server, real_format_archives, "sop")["Stanford_Online_Products.zip"]
    source = {"archive": {"url": f"{file_server.url}/flaky/Stanford_Online_Products.zip", "md5": md5}}
    params = make_params(default_raw_params, "sop", source, split={"scheme": "kfold", "num_folds": 3, "seed": 1})
    download_stage("sop", params.datasets["sop"])
    assert len(file_server.requests) == 2  # 503, then the file
    info = prepare_stage("sop", params.datasets["sop"], workers=1)
    data = PreparedDataset.load(in_project / "artifacts/prepared/sop")
    ebay = {
        split: pd.read_csv(in_project / f"artifacts/raw/sop/Stanford_Online_Products/Ebay_{split}.txt", sep=" ")
        for split in ("train", "test")
    }
    for split, table in ebay.items():
        assert classes(data.manifest, split) == set(table.class_id)
        assert info["splits"][split]["images"] == len(table)
    assert set(data.manifest.class_name[data.manifest.label == 1]) == {"bicycle_final/1"}
    folds = [set(data.split("val", fold=f).labels) for f in range(3)]
    assert sorted(len(f) for f in folds) == [4, 4, 4] and set().union(*folds) == set(range(1, 13))
    check_cache(data)


def test_inshop_from_the_dropbox_with_query_and_gallery(in_project, real_format_archives, default_raw_params, capsys):
    place_in_dropbox(in_project, real_format_archives, "inshop")
    params = make_params(default_raw_params, "inshop", {}, split={"scheme": "fixed_val", "val_fraction": 0.25})
    download_stage("inshop", params.datasets["inshop"])
    err = capsys.readouterr().err
    assert "img.zip has no published md5; its md5" in err and "sha256 is recorded in data/img.zip.sha256" in err
    record = read_json(in_project / "artifacts/raw/inshop/archives.json")
    assert {r["filename"]: r["md5"] for r in record} == real_format_archives["inshop"]["md5"]
    info = prepare_stage("inshop", params.datasets["inshop"], workers=1)
    manifest = PreparedDataset.load(in_project / "artifacts/prepared/inshop").manifest
    assert DATASETS["inshop"].query_gallery
    assert set(manifest.split) == {"train", "val", "query", "gallery"}
    assert classes(manifest, "query") == classes(manifest, "gallery") == set(range(9, 17))
    training = classes(manifest, "train") | classes(manifest, "val")
    assert training == set(range(1, 9)) and len(classes(manifest, "val")) == 2
    assert not classes(manifest, "train") & classes(manifest, "val")
    assert info["splits"]["query"] == {"images": 8, "classes": 8} and info["splits"]["gallery"]["images"] == 16
    assert manifest.class_name[manifest.label == 3].tolist() == ["id_00000003"]


def test_inshop_partition_count_is_checked_before_anything_is_recorded(
    in_project, real_format_archives, default_raw_params
):
    place_in_dropbox(in_project, real_format_archives, "inshop")
    partition = in_project / "data" / "list_eval_partition.txt"
    lines = partition.read_text().splitlines()
    partition.write_text("\n".join(lines[:-1]) + "\n")  # one image fewer than line 1 declares
    params = make_params(default_raw_params, "inshop", {})
    declared = real_format_archives["inshop"]["images"]
    with pytest.raises(DataError) as error:
        download_stage("inshop", params.datasets["inshop"])
    assert str(error.value) == (
        f"inshop: img.zip + list_eval_partition.txt: list_eval_partition.txt: line 1 declares {declared} images, "
        f"the file lists {declared - 1}"
    )
    assert not (in_project / "artifacts/raw/inshop").exists() and not list((in_project / "data").glob("*.sha256"))


def test_dropbox_archive_is_used_without_any_request(in_project, file_server, real_format_archives, default_raw_params):
    md5 = serve(file_server, real_format_archives, "cub200")["CUB_200_2011.tgz"]
    place_in_dropbox(in_project, real_format_archives, "cub200")
    source = {"archive": {"url": f"{file_server.url}/CUB_200_2011.tgz", "md5": md5}}
    download_stage("cub200", make_params(default_raw_params, "cub200", source).datasets["cub200"])
    assert file_server.requests == [] and (in_project / "artifacts/raw/cub200/CUB_200_2011/images").is_dir()


def test_wrong_md5_download_fails_and_keeps_nothing(in_project, file_server, real_format_archives, default_raw_params):
    serve(file_server, real_format_archives, "cub200")
    source = {"archive": {"url": f"{file_server.url}/CUB_200_2011.tgz", "md5": "0" * 32}}
    with pytest.raises(
        DataError,
        match=r"cub200: .*md5 is [0-9a-f]{32}, expected 0{32}; the download was deleted; "
        r"or place CUB_200_2011.tgz \(md5 0{32}\) in data/",
    ):
        download_stage("cub200", make_params(default_raw_params, "cub200", source).datasets["cub200"])
    assert list((in_project / "data").iterdir()) == [] and not (in_project / "artifacts").exists()


def test_corrupt_image_fails_or_is_skipped_and_listed(in_project, real_format_archives, default_raw_params):
    md5 = real_format_archives["sop"]["md5"]["Stanford_Online_Products.zip"]
    place_in_dropbox(in_project, real_format_archives, "sop")
    params = make_params(default_raw_params, "sop", {"archive": {"md5": md5}})
    download_stage("sop", params.datasets["sop"])
    raw = in_project / "artifacts/raw/sop/Stanford_Online_Products"
    prepare_stage("sop", params.datasets["sop"], workers=1)
    before = PreparedDataset.load(in_project / "artifacts/prepared/sop")
    bad = "cabinet_final/111002_1.JPG"
    (raw / bad).write_bytes((raw / bad).read_bytes()[:200])  # truncated JPEG
    with pytest.raises(
        DataError, match=rf"sop: 1 unreadable image\(s\): Stanford_Online_Products/{bad} .*skip_corrupt: true"
    ):
        prepare_stage("sop", params.datasets["sop"], workers=1)
    assert PreparedDataset.load(in_project / "artifacts/prepared/sop").info == before.info  # old result intact
    skipping = make_params(default_raw_params, "sop", {"archive": {"md5": md5}}, skip_corrupt=True)
    info = prepare_stage("sop", skipping.datasets["sop"], workers=2)
    after = PreparedDataset.load(in_project / "artifacts/prepared/sop")
    assert [s["path"] for s in info["skipped"]] == [f"Stanford_Online_Products/{bad}"]
    assert len(after.manifest) == len(before.manifest) - 1 and bad not in "".join(after.manifest.path)
    keep = (before.manifest.path != f"Stanford_Online_Products/{bad}").to_numpy()
    np.testing.assert_array_equal(after.images, before.images[keep])
    np.testing.assert_array_equal(after.sizes, before.sizes[keep])


def test_download_stage_cli_prints_the_cars_error_in_one_line(tmp_path, default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["datasets"] = {"cars196": {"source": {}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "download.py"), "--dataset", "cars196"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cars196: no Cars196 files in data/ (no public download")
    assert "docs/datasets.md#cars196-layouts" in lines[0]


def test_source_must_be_written_for_dvc(default_raw_params):
    from dmlbench.errors import ConfigError

    raw = copy.deepcopy(default_raw_params)
    raw["datasets"] = {"cub200": {"image_size": 256}}
    with pytest.raises(ConfigError, match=r"datasets.cub200: source: required key is missing .*`source: \{\}`"):
        parse_params(raw)
    raw["datasets"] = {"cub200": {"source": {"archive": {"url": "ftp://x/y.tgz"}}}}
    with pytest.raises(ConfigError, match=r"datasets.cub200.source.archive.url: String should match pattern"):
        parse_params(raw)
    raw["datasets"] = {"cub200": {"source": {"mirror": {}}}}
    with pytest.raises(
        ConfigError, match=r"datasets.cub200.source.mirror: unknown key; allowed: allow_subset, archive"
    ):
        parse_params(raw)
