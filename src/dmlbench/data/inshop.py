"""DeepFashion In-Shop Clothes Retrieval (Liu et al., CVPR 2016): 52,712 images of 7,982 items.

Split from ``Eval/list_eval_partition.txt`` (train / query / gallery, as Proxy-Anchor's ``Inshop.py``).
Images: ``Img/img.zip``, or ``img_highres.zip`` (OML) when placed in ``data/``; from Google Drive, no
published checksum (recorded on first use)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_problems, fetch_archives
from dmlbench.data.base import Archive, Counts, DatasetParams, DatasetSpec, UrlCheck, read_table
from dmlbench.data.content import content_check
from dmlbench.data.download import drive_url, drive_view_url
from dmlbench.errors import DataError

NAME = "inshop"
PARTITION = "list_eval_partition.txt"
HEADER = ["image_name", "item_id", "evaluation_status"]
STATUSES = ("train", "query", "gallery")
HOMEPAGE = "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html"
DEEPFASHION = "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html"
# 52,712 images: the release's README (Img/img.zip); 7,982 items: the benchmark page (HOMEPAGE); the
# partition's 3,997 training items (25,882 images) and 3,985 test items (14,218 query, 12,612 gallery
# images) as the DML papers report them (Kim et al., Proxy Anchor Loss, CVPR 2020, section 5.1).
COUNTS = Counts(
    52_712,
    7_982,
    (("train", 25_882, 3_997), ("query", 14_218, 3_985), ("gallery", 12_612, 3_985)),
    source="Liu et al. 2016, the In-shop README; Kim et al. 2020",
)

# The partition files of DeepFashion's other benchmarks (mmfashion docs/dataset/*.md: the line-2
# headers; the image counts of their benchmark pages).
OTHER_BENCHMARKS: dict[tuple[str, ...], str] = {
    ("image_pair_name_1", "image_pair_name_2", "item_id", "evaluation_status"): "Consumer-to-shop Clothes Retrieval",
}
IMAGE_STATUS = ("image_name", "evaluation_status")  # Category and Attribute Prediction, Fashion Landmark Detection
CATEGORY_IMAGES, LANDMARK_IMAGES = 289_222, 123_016

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
# Password-protected in the official release (open-mmlab/mmfashion#82): the password comes from
# the DeepFashion authors through the agreement form their project page links.
HIGHRES = Archive(
    key="images_highres",
    filename="img_highres.zip",
    url=None,
    md5=None,
    how_to_get=f"In-shop's Img/ folder, {DRIVE_FOLDER}",
    encrypted_hint=(
        f"DeepFashion encrypts img_highres.zip; ask for its password with the agreement form of {DEEPFASHION}, "
        "unpack it (unzip -P <password> img_highres.zip) and zip the img_highres/ folder again without one as "
        "data/img_highres.zip, or use img.zip (docs/datasets.md#in-shop)"
    ),
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
    images_highres: ArchiveSource = ArchiveSource()
    partition: ArchiveSource = ArchiveSource()


class InshopParams(DatasetParams):
    source: InshopSource = InshopSource()


def image_archive(source: InshopSource, dropbox: Path) -> tuple[Archive, str]:
    """The images this run uses and a note on the file it ignores (empty if none): ``img_highres.zip``
    when it is in ``dropbox`` (or its ``url`` is set), else ``img.zip``."""
    if source.images_highres.url or (dropbox / HIGHRES.filename).exists():
        ignored = (dropbox / IMAGES.filename).exists()
        note = f"{NAME}: using {HIGHRES.filename}; {IMAGES.filename} in {dropbox}/ is ignored" if ignored else ""
        return HIGHRES, note
    return IMAGES, ""


def archives_for(params: InshopParams, dropbox: Path) -> tuple[Archive, ...]:
    """The files this run needs (what ``make fetch`` downloads)."""
    return image_archive(params.source, Path(dropbox))[0], PARTITION_FILE


def preflight(params: InshopParams, dropbox: Path, unreachable: UrlCheck) -> list[str]:
    return archive_problems(NAME, archives_for(params, dropbox), params.source, Path(dropbox), unreachable)


def fetch(params: InshopParams, raw_dir: Path, dropbox: Path) -> None:
    """The images (``img.zip`` or ``img_highres.zip``) and the partition file, checked, into ``raw_dir``."""
    images, note = image_archive(params.source, Path(dropbox))
    if note:
        print(note, file=sys.stderr)
    check = content_check(NAME, read_annotations, COUNTS, params)
    fetch_archives(NAME, (images, PARTITION_FILE), params.source, Path(raw_dir), Path(dropbox), check)


def _benchmark_of(header: list[str], declared: str, first_image: str) -> str | None:
    """The DeepFashion benchmark whose partition file has this ``header`` (None: In-Shop's or unknown)."""
    if tuple(header) in OTHER_BENCHMARKS:
        return OTHER_BENCHMARKS[tuple(header)]
    if tuple(header) == IMAGE_STATUS:
        if declared == str(LANDMARK_IMAGES) or re.fullmatch(r"img/img_\d+\.jpg", first_image):
            return "Fashion Landmark Detection"
        if declared == str(CATEGORY_IMAGES) or re.fullmatch(r"img/[^/]+/img_\d+\.jpg", first_image):
            return "Category and Attribute Prediction"
        return "Category and Attribute Prediction (or Fashion Landmark Detection)"
    return None


def read_annotations(params: InshopParams, raw_dir: Path) -> pd.DataFrame:
    """Every row of the partition file; label = item number, split = train / query / gallery."""
    raw_dir = Path(raw_dir)
    expected = f"In-shop's Eval/{PARTITION} (line 1: the image count, line 2: '{' '.join(HEADER)}')"
    if not (raw_dir / PARTITION).is_file():
        raise DataError(f"no {PARTITION}; expected {expected}")
    with open(raw_dir / PARTITION, errors="replace") as handle:
        lines = [handle.readline().split() for _ in range(3)]
    first, second, third = lines
    for header, count, image in ((first, "", (second or [""])[0]), (second, "".join(first), (third or [""])[0])):
        benchmark = _benchmark_of(header, count, image)
        if benchmark:
            raise DataError(
                f"{PARTITION} is the partition file of DeepFashion's {benchmark} benchmark; In-Shop needs the "
                f"In-shop Clothes Retrieval Benchmark's Eval/{PARTITION} (header '{' '.join(HEADER)}', status "
                f"train / query / gallery; {HOMEPAGE})"
            )
    if len(first) != 1 or not first[0].isdigit():
        shown = " ".join(first)
        what = "In-Shop's header line" if first == HEADER else repr(shown[:60])
        raise DataError(
            f"{PARTITION}: line 1 is {what}, expected the image count (the release's line 1 is "
            f"{COUNTS.images}, line 2 the header): a copy without its count line, or another file"
        )
    table = read_table(raw_dir, PARTITION, None, expected, skiprows=1)
    if list(table.columns) != HEADER or (table == "").any().any():
        raise DataError(
            f"{PARTITION}: line 2 is {' '.join(map(str, table.columns))!r}, expected '{' '.join(HEADER)}' "
            "and 3 fields on every line"
        )
    if len(table) != int(first[0]):
        raise DataError(f"{PARTITION}: line 1 declares {int(first[0])} images, the file lists {len(table)}")
    unknown = sorted(set(table["evaluation_status"]) - set(STATUSES))
    if unknown:
        raise DataError(
            f"{PARTITION}: evaluation status {unknown[0]!r}; In-Shop's are {', '.join(STATUSES)} (a partition "
            "file of another DeepFashion benchmark?)"
        )
    items = table["item_id"].str.fullmatch(r"id_\d+")
    if not items.all():
        raise DataError(f"{PARTITION}: item id {table['item_id'][~items].iloc[0]!r}, expected id_<number>")
    paths = table["image_name"]
    if not (raw_dir / "img").is_dir() and (raw_dir / "img_highres").is_dir():
        paths = paths.str.replace(r"^img/", "img_highres/", regex=True)  # the same names (OML's convert_inshop)
    return pd.DataFrame(
        {
            "path": paths,
            "label": table["item_id"].str.removeprefix("id_").astype("int64"),
            "class_name": table["item_id"],
            "split": table["evaluation_status"],
        }
    )


SPEC = DatasetSpec(
    name="inshop",
    params=InshopParams,
    fetch=fetch,
    read_annotations=read_annotations,
    description="DeepFashion In-Shop: 7,982 clothing items, 52,712 images (train / query / gallery)",
    query_gallery=True,
    archives=(IMAGES, HIGHRES, PARTITION_FILE),
    homepage=HOMEPAGE,
    preflight=preflight,
    archives_for=archives_for,
    counts=COUNTS,
)
