"""The download stage's output is a record of its extraction; the extraction itself is scratch that
prepare re-creates from ``data/`` (a pulled grid's clone has none), refusing in one line when the
archives are absent or the re-created files differ from the record."""

from __future__ import annotations

import shutil

import pytest
from helpers.project import small_params_dict

from dmlbench import paths
from dmlbench.data.raw_record import MARKER
from dmlbench.data.stage import download_stage, prepare_stage
from dmlbench.errors import DataError
from dmlbench.io import md5_file, read_json, write_json
from dmlbench.params.load import parse_params


@pytest.fixture
def glyphs(default_raw_params):
    raw = small_params_dict(default_raw_params)
    raw["datasets"]["glyphs"]["source"].update(num_classes=12, images_per_class=4)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "fixed_val", "val_fraction": 0.25, "seed": 0}
    return parse_params(raw).datasets["glyphs"]


def test_prepare_re_creates_a_missing_extraction_as_recorded(in_project, glyphs):
    download_stage("glyphs", glyphs)
    record = read_json(paths.downloaded_record("glyphs"))
    assert record["files"] == 12 * 4 + 1 and len(record["digest"]) == 32  # the images and labels.csv
    prepare_stage("glyphs", glyphs, workers=1)
    images = paths.prepared_dir("glyphs") / "images.npy"
    first = md5_file(images)
    shutil.rmtree(paths.raw_dir("glyphs"))  # a fresh clone: the record pulled, no extraction
    prepare_stage("glyphs", glyphs, workers=1)
    assert read_json(paths.raw_dir("glyphs") / MARKER)["digest"] == record["digest"]
    assert md5_file(images) == first


def test_prepare_refuses_an_extraction_that_differs_from_the_record(in_project, glyphs):
    download_stage("glyphs", glyphs)
    record = read_json(paths.downloaded_record("glyphs"))
    write_json(paths.downloaded_record("glyphs"), {**record, "digest": "0" * 32})  # another lab's files
    with pytest.raises(DataError, match=r"artifacts/raw/glyphs: re-created from data/ with digest [0-9a-f]{32}, but "):
        prepare_stage("glyphs", glyphs, workers=1)
    assert not paths.prepared_dir("glyphs").exists()


def test_prepare_names_what_to_do_when_the_archives_are_absent(in_project, default_raw_params):
    raw = small_params_dict(default_raw_params)
    raw["datasets"] = {"cub200": {"source": {}, "split": {"scheme": "standard"}}}
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "published"  # a 'standard' split has no validation classes
    params = parse_params(raw).datasets["cub200"]
    write_json(paths.downloaded_record("cub200"), {"dataset": "cub200", "archives": {}, "files": 1, "digest": "0" * 32})
    with pytest.raises(DataError) as failure:
        prepare_stage("cub200", params, workers=1)
    line = str(failure.value)
    assert "\n" not in line and "CUB_200_2011.tgz not in data/" in line and "dvc pull data.dvc" in line
