"""Dataset files fabricated in the layouts users really download: the exact file and folder
names, ``.mat`` structs as ``scipy.io.savemat`` writes MATLAB's (1 x N struct arrays, 1 x N
cells), the real header lines; few images (the counts are tested apart, with ``allow_subset``),
except :func:`cub_full`, CUB-200-2011 at its published 11,788 images.

Sources of each layout: Cars196's classification release (its devkit README: ``cars_meta.mat``'s
``class_names``, the ``annotations`` struct of bbox_x1, bbox_y1, bbox_x2, bbox_y2, class, fname;
``cars_test_annos.mat`` without class), Kaggle's jessicali9530/stanford-cars-dataset
(``cars_annos.mat``, ``cars_train/cars_train/``, ``cars_test/cars_test/``; pytorch/vision#7545),
abdelrahmant11/standford-cars-dataset-meta (``car_devkit.tgz``, ``devkit/``,
``cars_test_annos_withlabels (1).mat``, ``cars_annos (2).mat``), jutrera/stanford-car-dataset-by-
classes-folder as pytorch-metric-learning 2.9 reads it (``names.csv``, headerless
``anno_{train,test}.csv``, ``car_data/car_data/{train,test}/<class name, '/' as '-'>/``);
DeepFashion's partition files (mmfashion ``docs/dataset/*.md``: count line, header line).
"""

from __future__ import annotations

import io
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from helpers.archives import JPEG_SIZES, write_jpeg

BOX_FIELDS = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2")
ODD_NAME = 150  # a class whose name has a '/', as "Ram C/V Cargo Van Minivan 2012" has
# The classes fabricated (of 196: class_names lists all): both ends of both halves (1-98 | 99-196).
CAR_LABELS = (1, 2, 5, 97, 98, 99, 100, ODD_NAME, 195, 196)


def car_name(label: int) -> str:
    return f"Ram C/V Cargo Van Minivan {label}" if label == ODD_NAME else f"Make{label} Model {label} 2012"


def annotations_struct(rows: list[tuple[int, str]], labelled: bool = True) -> np.ndarray:
    """The devkit's ``annotations``: a 1 x N struct of bbox_x1..y2, class, fname (no class: the test file)."""
    fields = (*BOX_FIELDS, "class", "fname") if labelled else (*BOX_FIELDS, "fname")
    table = np.zeros((1, len(rows)), dtype=[(field, "O") for field in fields])
    for i, (label, fname) in enumerate(rows):
        boxes = [np.array([[v]], dtype=np.uint16) for v in (1, 2, 17, 15)]
        label_cell = [np.array([[label]], dtype=np.uint8)] if labelled else []
        table[0, i] = (*boxes, *label_cell, np.array([fname]))
    return table


def names_cell(names: list[str]) -> np.ndarray:
    cell = np.empty((1, len(names)), dtype=object)
    for i, name in enumerate(names):
        cell[0, i] = np.array([name])
    return cell


def zip_files(archive: Path, files: dict[str, Path | bytes]) -> Path:
    """A zip of ``{name in the zip: file or bytes}``."""
    with zipfile.ZipFile(archive, "w") as zf:
        for name, source in files.items():
            if isinstance(source, bytes):
                zf.writestr(name, source)
            else:
                zf.write(source, arcname=name)
    return archive


def tar_files(archive: Path, files: dict[str, Path | bytes]) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        for name, source in files.items():
            data = source if isinstance(source, bytes) else source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def tree(root: Path, under: str = "") -> dict[str, Path]:
    """Every file under ``root`` by its path relative to ``root``'s parent (or ``under``)."""
    prefix = under or root.name
    return {f"{prefix}/{p.relative_to(root).as_posix()}": p for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- Cars196


class CarsRelease:
    """The classification release with one image of each of :data:`CAR_LABELS` in each folder
    (``00001.jpg`` = class 1 in both; 20 images; ``cars_meta.mat`` names all 196 classes): its
    folders, devkit files, the labelled test file and ``cars_annos.mat``."""

    def __init__(self, out: Path):
        from scipy.io import savemat

        self.root = out / "release"
        rows = [(label, f"{label:05d}.jpg") for label in CAR_LABELS]
        for folder, offset in (("cars_train", 0), ("cars_test", 1)):
            for label, fname in rows:
                w, h = JPEG_SIZES[(label + offset) % len(JPEG_SIZES)]
                write_jpeg(self.root / folder / fname, w, h, seed=40_000 + 2 * label + offset)
        devkit = self.root / "devkit"
        devkit.mkdir()
        savemat(devkit / "cars_meta.mat", {"class_names": names_cell([car_name(i) for i in range(1, 197)])})
        savemat(devkit / "cars_train_annos.mat", {"annotations": annotations_struct(rows)})
        savemat(devkit / "cars_test_annos.mat", {"annotations": annotations_struct(rows, labelled=False)})
        (devkit / "README.txt").write_text("This file gives documentation for the cars 196 dataset.\n")
        (devkit / "eval_train.m").write_text("function [accuracy, confusion_matrix] = eval_train(pred_file)\n")
        (devkit / "train_perfect_preds.txt").write_text("".join(f"{label}\n" for label, _ in rows))
        self.withlabels = self.root / "cars_test_annos_withlabels.mat"
        savemat(self.withlabels, {"annotations": annotations_struct(rows)})
        # the Stanford release's cars_annos.mat (Kaggle's jessicali9530 zip holds a copy)
        fields = ["relative_im_path", *BOX_FIELDS, "class", "test"]
        annos = np.zeros((1, 2 * len(rows)), dtype=[(f, "O") for f in fields])
        for i in range(2 * len(rows)):
            values = (f"car_ims/{i + 1:06d}.jpg", 1, 2, 17, 15, rows[i % len(rows)][0], i // len(rows))
            annos[0, i] = tuple(
                np.array([v]) if f == "relative_im_path" else np.array([[v]], dtype=np.uint16)
                for f, v in zip(fields, values, strict=True)
            )
        self.cars_annos = self.root / "cars_annos.mat"
        names = names_cell([car_name(i) for i in range(1, 197)])
        savemat(self.cars_annos, {"annotations": annos, "class_names": names})

    def devkit_files(self) -> dict[str, Path]:
        return tree(self.root / "devkit")

    def kaggle_images_zip(self, archive: Path) -> Path:
        """Kaggle jessicali9530/stanford-cars-dataset: ``cars_annos.mat``, ``cars_{train,test}/cars_{train,test}/``."""
        files: dict[str, Path | bytes] = {"cars_annos.mat": self.cars_annos}
        for folder in ("cars_train", "cars_test"):
            files.update(tree(self.root / folder, f"{folder}/{folder}"))
        return zip_files(archive, files)

    def car_devkit_tgz(self, archive: Path) -> Path:
        """The release's (and pytorch/vision#7545's re-uploaded) ``car_devkit.tgz``: ``devkit/...``."""
        return tar_files(archive, dict(self.devkit_files()))

    def kaggle_meta_zip(self, archive: Path, with_folder: bool = True) -> Path:
        """Kaggle abdelrahmant11/standford-cars-dataset-meta: ``car_devkit.tgz``, ``devkit/`` (unless not
        ``with_folder``), ``cars_test_annos_withlabels (1).mat``, ``cars_annos (2).mat``."""
        devkit = self.car_devkit_tgz(archive.with_name("inner_car_devkit.tgz"))
        files: dict[str, Path | bytes] = {
            "car_devkit.tgz": devkit,
            "cars_annos (2).mat": self.cars_annos,
            "cars_test_annos_withlabels (1).mat": self.withlabels,
        }
        if with_folder:
            files.update(self.devkit_files())
        return zip_files(archive, files)

    def release_tgz(self, folder: str, archive: Path) -> Path:
        """``cars_train.tgz`` / ``cars_test.tgz``: ``cars_train/*.jpg``."""
        return tar_files(archive, dict(tree(self.root / folder)))

    def torchvision_folder(self, target: Path) -> Path:
        """torchvision's ``stanford_cars/``: cars_train/, cars_test/, devkit/, cars_test_annos_withlabels.mat."""
        import shutil

        for name in ("cars_train", "cars_test", "devkit"):
            shutil.copytree(self.root / name, target / name)
        shutil.copy(self.withlabels, target / self.withlabels.name)
        return target

    def class_folders_zip(self, archive: Path) -> Path:
        """Kaggle jutrera/stanford-car-dataset-by-classes-folder: ``names.csv``, ``anno_train.csv``,
        ``anno_test.csv`` (``fname,x1,y1,x2,y2,class``), ``car_data/car_data/{train,test}/<class>/``."""
        files: dict[str, Path | bytes] = {"names.csv": "".join(f"{car_name(i)}\n" for i in range(1, 197)).encode()}
        for folder, split in (("cars_train", "train"), ("cars_test", "test")):
            rows = []
            for label in CAR_LABELS:
                fname = f"{label:05d}.jpg"
                files[f"car_data/car_data/{split}/{car_name(label).replace('/', '-')}/{fname}"] = (
                    self.root / folder / fname
                )
                rows.append(f"{fname},1,2,17,15,{label}\n")
            files[f"anno_{split}.csv"] = "".join(rows).encode()
        return zip_files(archive, files)


# --------------------------------------------------------------------------- In-Shop


def inshop_partition_lines(out: Path) -> list[str]:
    return (out / "list_eval_partition.txt").read_text().splitlines()


def highres_zip(img_zip: Path, archive: Path, password: bytes | None = None) -> Path:
    """``img_highres.zip``: ``img.zip``'s images under ``img_highres/`` (same names); ZipCrypto-encrypted
    with ``password`` as the official file is."""
    with zipfile.ZipFile(img_zip) as zf:
        files = {
            "img_highres/" + info.filename.removeprefix("img/"): zf.read(info)
            for info in zf.infolist()
            if not info.is_dir()
        }
    if password is None:
        return zip_files(archive, dict(files))
    return encrypted_zip(archive, files, password)


def _crc_update(key: int, byte: int) -> int:
    """One step of the CRC-32 the PKWARE cipher uses (APPNOTE.TXT 6.1.5), through zlib."""
    return zlib.crc32(bytes([byte]), key ^ 0xFFFFFFFF) ^ 0xFFFFFFFF


class _ZipCrypto:
    """The traditional PKWARE encryption (APPNOTE.TXT 6.1): what ``zip -P`` writes and zipfile reads."""

    def __init__(self, password: bytes):
        self.keys = [0x12345678, 0x23456789, 0x34567890]
        for byte in password:
            self._update(byte)

    def _update(self, byte: int) -> None:
        k0, k1, k2 = self.keys
        k0 = _crc_update(k0, byte)
        k1 = ((k1 + (k0 & 0xFF)) * 134775813 + 1) & 0xFFFFFFFF
        k2 = _crc_update(k2, k1 >> 24)
        self.keys = [k0, k1, k2]

    def encrypt(self, data: bytes) -> bytes:
        out = bytearray()
        for byte in data:
            temp = (self.keys[2] | 2) & 0xFFFF
            out.append(byte ^ (((temp * (temp ^ 1)) >> 8) & 0xFF))
            self._update(byte)
        return bytes(out)


def encrypted_zip(archive: Path, files: dict[str, bytes], password: bytes) -> Path:
    """A zip of stored entries, each ZipCrypto-encrypted (general purpose flag bit 0)."""
    body, central = bytearray(), bytearray()
    for name, data in files.items():
        crc, raw_name = zlib.crc32(data), name.encode()
        header = bytes(11) + bytes([crc >> 24])  # 12 bytes; the last checks the password (APPNOTE 6.1.6)
        payload = _ZipCrypto(password).encrypt(header + data)
        fields = (20, 1, 0, 0, 0x21, crc, len(payload), len(data), len(raw_name), 0)
        offset = len(body)
        body += struct.pack("<4s5H3I2H", b"PK\x03\x04", *fields) + raw_name + payload
        central += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, *fields, 0, 0, 0, 0, offset) + raw_name
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(files), len(files), len(central), len(body), 0)
    archive.write_bytes(bytes(body + central + end))
    with zipfile.ZipFile(archive) as zf:  # a real encrypted zip: the password reads it back
        first = next(iter(files))
        assert zf.read(first, pwd=password) == files[first]
    return archive


CONSUMER_TO_SHOP = (
    "195540\n"
    "image_pair_name_1 image_pair_name_2 item_id evaluation_status\n"
    "img/CLOTHING/Blouse/id_00000001/comsumer_01.jpg img/CLOTHING/Blouse/id_00000001/shop_01.jpg id_00000001 train\n"
)
CATEGORY_AND_ATTRIBUTE = (
    "289222\n"
    "image_name  evaluation_status\n"
    "img/Sheer_Pleated-Front_Blouse/img_00000001.jpg                        train\n"
)


# --------------------------------------------------------------------------- CUB-200-2011 at full size


def cub_full(archive: Path) -> Path:
    """``CUB_200_2011.tgz`` with the published 11,788 images of 200 classes, 5,864 in classes
    1-100 and 5,924 in 101-200 (one 8 x 8 JPEG, repeated), ``attributes.txt`` beside the folder."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 120, np.uint8)).save(buffer, format="JPEG")
    jpeg = buffer.getvalue()
    # per class: 58 or 59 images in 1-100 (64 x 59 + 36 x 58 = 5,864), 59 or 60 in 101-200 (24 x 60 + 76 x 59)
    sizes = [59] * 64 + [58] * 36 + [60] * 24 + [59] * 76
    images, labels, classes, split = [], [], [], []
    members: list[tuple[str, bytes]] = []
    image_id = 0
    for label, size in enumerate(sizes, start=1):
        folder = f"{label:03d}.Bird_{label}"
        classes.append(f"{label} {folder}\n")
        for k in range(size):
            image_id += 1
            rel = f"{folder}/Bird_{label}_{k:04d}_{image_id}.jpg"
            members.append((f"CUB_200_2011/images/{rel}", jpeg))
            images.append(f"{image_id} {rel}\n")
            labels.append(f"{image_id} {label}\n")
            split.append(f"{image_id} {k % 2}\n")
    texts = {"images.txt": images, "image_class_labels.txt": labels, "classes.txt": classes}
    texts["train_test_split.txt"] = split
    members += [(f"CUB_200_2011/{name}", "".join(lines).encode()) for name, lines in texts.items()]
    members.append(("attributes.txt", b"1 has_bill_shape::curved\n"))
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


# --------------------------------------------------------------------------- the stage scripts


def run_stage(project: Path, stage: str, dataset: str, section: dict) -> tuple[int, str]:
    """``python stages/<stage>.py --dataset <dataset>`` in ``project`` (params.yaml: ``datasets:
    {dataset: section}``), run in this process: (exit status, what it printed on stderr)."""
    import contextlib
    import os
    import runpy
    import sys

    import yaml

    from helpers.project import ROOT

    (project / "params.yaml").write_text(yaml.safe_dump({"datasets": {dataset: section}}))
    stderr, argv, cwd = io.StringIO(), sys.argv, Path.cwd()
    sys.argv = [f"stages/{stage}.py", "--dataset", dataset]
    os.chdir(project)
    try:
        with contextlib.redirect_stderr(stderr):
            runpy.run_path(str(ROOT / "stages" / f"{stage}.py"), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return code, stderr.getvalue()


def error_lines(stderr: str) -> list[str]:
    """The ``error:`` lines a stage printed (its progress bars left out)."""
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("error: ")]
