"""Stanford Online Products (Oh Song et al., CVPR 2016): 120,053 eBay photos of 22,634 products.

DML split from ``Ebay_train.txt`` (11,318 classes, 59,551 images) and ``Ebay_test.txt``
(11,316 classes, 60,502 images); columns ``image_id class_id super_class_id path``, paths
under the 12 ``<category>_final/`` folders.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, DatasetParams, DatasetSpec
from dmlbench.data.download import drive_url

ROOT = "Stanford_Online_Products"

# URL: the HTTP face of ftp://cs.stanford.edu/cs/cvgl/ (chainer/chainercv issue #643); mirror:
# the Google Drive copy pytorch-metric-learning downloads (src/pytorch_metric_learning/datasets/
# sop.py, id 1TclrpQOF_ullUP99wk_gjGN8pKvtErG8, also in OML's README), tried when the Stanford
# server fails; md5 (the judge for both): powerful-benchmarker (branch metric-learning)
# datasets/stanford_online_products.py; size: TensorFlow Datasets url_checksums.
ARCHIVE = Archive(
    key="archive",
    filename="Stanford_Online_Products.zip",
    url="http://ftp.cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
    md5="7f73d41a2f44250d4779881525aea32e",
    size=3_083_860_082,
    how_to_get="https://cvgl.stanford.edu/projects/lifted_struct/",
    mirrors=(drive_url("1TclrpQOF_ullUP99wk_gjGN8pKvtErG8"),),
)


class SopSource(ArchiveSourceParams):
    archive: ArchiveSource = ArchiveSource()


class SopParams(DatasetParams):
    source: SopSource = SopSource()


def read_annotations(params: SopParams, raw_dir: Path) -> pd.DataFrame:
    """``Ebay_train.txt`` -> train, ``Ebay_test.txt`` -> test; class name = category folder / class id."""
    parts = []
    for split in ("train", "test"):
        table = pd.read_csv(Path(raw_dir) / ROOT / f"Ebay_{split}.txt", sep=r"\s+", dtype={"path": str})
        parts.append(
            pd.DataFrame(
                {
                    "path": f"{ROOT}/" + table["path"],
                    "label": table["class_id"].astype(int),
                    "class_name": table["path"].str.split("/").str[0] + "/" + table["class_id"].astype(str),
                    "split": split,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


SPEC = DatasetSpec(
    name="sop",
    params=SopParams,
    fetch=archive_fetcher("sop", (ARCHIVE,)),
    read_annotations=read_annotations,
    description="Stanford Online Products: 22,634 products, 120,053 images (Ebay_train / Ebay_test)",
    archives=(ARCHIVE,),
    homepage="https://cvgl.stanford.edu/projects/lifted_struct/",
)
