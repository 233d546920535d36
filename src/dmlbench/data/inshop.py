"""DeepFashion In-Shop Clothes Retrieval (Liu et al., CVPR 2016): 52,712 images of 7,982 items.

Split from ``Eval/list_eval_partition.txt`` (line 1: image count, line 2: header
``image_name item_id evaluation_status``): 3,997 training items (25,882 images); the 3,985
test items are queried (14,218 query images) against a gallery (12,612 images), as in
Proxy-Anchor's ``Inshop.py``. Images come from the low-resolution ``Img/img.zip`` (what most
DML code uses; ``img_highres.zip`` is password-protected). Both files live only on Google
Drive: they are downloaded with their resource keys, through Drive's confirmation page for
large files (:mod:`dmlbench.data.download`). Drive may still refuse (its daily download quota,
a changed sharing setting): the error then names the page to download the file from by hand.
No checksum is published: the md5 and sha256 are recorded on first use (``data/<file>.sha256``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, DatasetParams, DatasetSpec
from dmlbench.data.download import drive_url, drive_view_url
from dmlbench.errors import DataError

PARTITION = "list_eval_partition.txt"

# Google Drive folder and file ids of the DeepFashion In-shop release (the folder is linked from
# the DeepFashion project page, mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html) with the resource
# keys Drive has required for these older files since 2021, as public code links them: the
# folder's in the README of soc12/6th-Place-Solution-to-Google-Universal-Image-Embedding, the
# files' (``/file/d/<id>/view?resourcekey=...``) in the docstring of easydl's DeepFashion module.
DRIVE_FOLDER = (
    "https://drive.google.com/drive/folders/0B7EVK8r0v71pVDZFQXRsMDZCX1E?resourcekey=0-4R4v6zl4CWhHTsUGOsTstw"
)
IMAGES_DRIVE = ("0B7EVK8r0v71pS2YxRE1QTFZzekU", "0-2n-dbZygJiZdm0UbEaFRTA")
PARTITION_DRIVE = ("0B7EVK8r0v71pYVBqLXpRVjhHeWM", "0-rxJ2QcImN-IRo_Bv9QSXmg")

IMAGES = Archive(
    key="images",
    filename="img.zip",
    url=drive_url(*IMAGES_DRIVE),
    md5=None,
    how_to_get=drive_view_url(*IMAGES_DRIVE),
)
PARTITION_FILE = Archive(
    key="partition",
    filename=PARTITION,
    url=drive_url(*PARTITION_DRIVE),
    md5=None,
    extract=False,
    how_to_get=drive_view_url(*PARTITION_DRIVE),
)


class InshopSource(ArchiveSourceParams):
    images: ArchiveSource = ArchiveSource()
    partition: ArchiveSource = ArchiveSource()


class InshopParams(DatasetParams):
    source: InshopSource = InshopSource()


def read_annotations(params: InshopParams, raw_dir: Path) -> pd.DataFrame:
    """Every row of the partition file; label = item number, split = train / query / gallery."""
    path = Path(raw_dir) / PARTITION
    with open(path) as handle:
        declared = int(handle.readline().split()[0])
    table = pd.read_csv(path, sep=r"\s+", skiprows=1, dtype=str)
    if len(table) != declared:
        raise DataError(f"{path}: line 1 declares {declared} images, the file lists {len(table)}")
    return pd.DataFrame(
        {
            "path": table["image_name"],
            "label": table["item_id"].str.removeprefix("id_").astype(int),
            "class_name": table["item_id"],
            "split": table["evaluation_status"],
        }
    )


SPEC = DatasetSpec(
    name="inshop",
    params=InshopParams,
    fetch=archive_fetcher("inshop", (IMAGES, PARTITION_FILE)),
    read_annotations=read_annotations,
    description="DeepFashion In-Shop: 7,982 clothing items, 52,712 images (train / query / gallery)",
    query_gallery=True,
    archives=(IMAGES, PARTITION_FILE),
    homepage="https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html",
)
