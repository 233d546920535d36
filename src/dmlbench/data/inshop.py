"""DeepFashion In-Shop Clothes Retrieval (Liu et al., CVPR 2016): 52,712 images of 7,982 items.

Split from ``Eval/list_eval_partition.txt`` (line 1: image count, line 2: header
``image_name item_id evaluation_status``): 3,997 training items (25,882 images); the 3,985
test items are queried (14,218 query images) against a gallery (12,612 images), as in
Proxy-Anchor's ``Inshop.py``. Images come from the low-resolution ``Img/img.zip`` (what most
DML code uses; ``img_highres.zip`` is password-protected). Both files live only on Google
Drive, which cannot be downloaded non-interactively: place them in ``data/``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, DatasetParams, DatasetSpec
from dmlbench.errors import DataError

PARTITION = "list_eval_partition.txt"
DRIVE_FOLDER = "https://drive.google.com/drive/folders/0B7EVK8r0v71pVDZFQXRsMDZCX1E"

# Google Drive folder and file ids of the DeepFashion In-shop release (the folder is linked from
# the DeepFashion project page, mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html);
# no checksum is published: the md5 is recorded in archives.json on first use and can be pinned.
IMAGES = Archive(
    key="images",
    filename="img.zip",
    url=None,
    md5=None,
    how_to_get=f"Img/img.zip of the In-shop folder {DRIVE_FOLDER} (file id 0B7EVK8r0v71pS2YxRE1QTFZzekU)",
)
PARTITION_FILE = Archive(
    key="partition",
    filename=PARTITION,
    url=None,
    md5=None,
    extract=False,
    how_to_get=f"Eval/{PARTITION} of the same folder (file id 0B7EVK8r0v71pYVBqLXpRVjhHeWM)",
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
