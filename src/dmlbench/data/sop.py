"""Stanford Online Products (Oh Song et al., CVPR 2016): 120,053 eBay photos of 22,634 products.

DML split: ``Ebay_train.txt`` and ``Ebay_test.txt`` (``image_id class_id super_class_id path``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, Counts, DatasetParams, DatasetSpec, integer_column, read_table
from dmlbench.data.download import drive_url
from dmlbench.errors import DataError

ROOT = "Stanford_Online_Products"
HEADER = ["image_id", "class_id", "super_class_id", "path"]
# 120,053 images of 22,634 classes; 11,318 classes (59,551 images) train, 11,316 (60,502) test:
# Oh Song et al., CVPR 2016, section 5 (the dataset) and section 6 (its split).
COUNTS = Counts(120_053, 22_634, (("train", 59_551, 11_318), ("test", 60_502, 11_316)), source="Oh Song et al. 2016")

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


def _no_top_folder(raw_dir: Path, name: str) -> DataError:
    """Ebay_<split>.txt is not under Stanford_Online_Products/: say where it is, if anywhere."""
    found = sorted(p.relative_to(raw_dir).as_posix() for p in Path(raw_dir).rglob(name) if "__MACOSX" not in p.parts)
    where = f"the files hold {found[0]} instead" if found else "the files hold none"
    return DataError(
        f"no {ROOT}/{name} ({where}); expected the published zip's layout: everything under its top folder "
        f"{ROOT}/ (Ebay_train.txt, Ebay_test.txt, the 12 <category>_final/ folders)"
    )


def read_annotations(params: SopParams, raw_dir: Path) -> pd.DataFrame:
    """``Ebay_train.txt`` -> train, ``Ebay_test.txt`` -> test; class name = category folder / class id."""
    parts = []
    for split in ("train", "test"):
        name = f"Ebay_{split}.txt"
        if not (Path(raw_dir) / ROOT / name).is_file():
            raise _no_top_folder(Path(raw_dir), name)
        rel = f"{ROOT}/{name}"
        table = read_table(raw_dir, rel, None, f"a table with the header line '{' '.join(HEADER)}'")
        if list(table.columns) != HEADER or (table == "").any().any():
            raise DataError(
                f"{rel}: header {' '.join(map(str, table.columns))!r}, expected '{' '.join(HEADER)}' "
                "and 4 fields on every line"
            )
        parts.append(
            pd.DataFrame(
                {
                    "path": f"{ROOT}/" + table["path"],
                    "label": integer_column(table, "class_id", rel),
                    "class_name": table["path"].str.split("/").str[0] + "/" + table["class_id"],
                    "split": split,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


SPEC = DatasetSpec(
    name="sop",
    params=SopParams,
    fetch=archive_fetcher("sop", (ARCHIVE,), read_annotations, COUNTS),
    read_annotations=read_annotations,
    description="Stanford Online Products: 22,634 products, 120,053 images (Ebay_train / Ebay_test)",
    archives=(ARCHIVE,),
    homepage="https://cvgl.stanford.edu/projects/lifted_struct/",
    counts=COUNTS,
)
