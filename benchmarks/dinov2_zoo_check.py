"""Reproduction check: frozen DINOv2 ViT-S/14 and ViT-B/14 Recall@1 on CUB200-2011 and Cars196,
as dmlbench runs the trunks, against the values OML's model zoo publishes for the same weights.

    python benchmarks/dinov2_zoo_check.py OUT_DIR [--fetch] [--data data] [--work artifacts/zoo-check]
                                         [--device cuda] [--batch-size 128]

Needs the archives in ``--data`` (CUB_200_2011.tgz; Cars196 in a layout docs/datasets.md lists) and
the two trunks' weights pinned in the weights lock and in the Hub cache (or the Hub reachable):
``--fetch`` (where the internet is) downloads the weights (pinned as ``make fetch`` pins them) and
CUB's archive first; Cars196 has no public URL. Without them it stops in one line naming what is
missing, before any work. A GPU makes it minutes (about 14,000 test images through two ViTs); the
CPU works, slowly. Prints a table and writes ``OUT_DIR/dinov2_zoo_check.json``; exit 0 when
every Recall@1 is within the tolerance of the reference, 1 when one is not, 2 when it cannot run.

Reference (:data:`REFERENCE`): OML-Team/open-metric-learning at HEAD (6be182e, 2025-11-27),
``docs/readme/examples_source/zoo/zoo_images.md``, table "Models, trained by other researchers"
("The metrics below are for 224 x 224 images"): ``vits14_dinov2`` CUB 0.797, CARS 0.503;
``vitb14_dinov2`` CUB 0.842, CARS 0.644 (cmc@1 = Recall@1). The DINOv2 paper (Oquab et al., TMLR
2024) reports linear-probe accuracies on these datasets, no retrieval Recall@1. OML's protocol
(``oml/registry/transforms.py``: ``get_normalisation_resize_hypvit(im_size=224)``;
``oml/models/vit_dino/extractor.py``; ``oml/functional/knn.py``): Resize(224, bicubic) of the short
side, CenterCrop(224), ImageNet mean/std, the class token after the final norm (not normalised),
Euclidean distances, the test half of each dataset (CUB classes 101-200, Cars 99-196) queried
against itself.

Here: the same weights through dmlbench's trunk (timm's pre-logits, ``pooling: cls``: the class
token after the final norm), the prepared cache at a 224 px short side (antialiased bilinear, the
long side centre-cropped to 4/3 of it) and a 224 px centre crop (bicubic, a no-op resize at this
size), the same test halves, leave-one-out Recall@1 by Euclidean distance (OML's) and by cosine
similarity (dmlbench's ranking, reported beside it).

Tolerance: |Recall@1 (Euclidean) - OML's| <= 0.02. The binomial 95% half-width of a Recall@1 near
these values is about 0.010 on CUB's 5,924 test queries and 0.011 on Cars' 8,131; the rest allows
for the resize kernels (antialiased bilinear then crop, against PIL bicubic). OML warns that its
values "may be different from the ones reported by papers, because the version of train/val split
and usage of bounding boxes may differ" (none are used here): a miss flags a protocol difference to
look into, not by itself a wrong trunk. The trunks' wiring against timm is tested in
tests/test_trunk_reference.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dmlbench.data import DATASETS
from dmlbench.data.archives import dataset_problems, ensure_archive, resolve
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.prepare import prepare_dataset
from dmlbench.errors import DmlbenchError
from dmlbench.evaluate.embed import compute_embeddings
from dmlbench.models import BACKBONES, build_model
from dmlbench.models.hub import hub_file_problem

# OML zoo, docs/readme/examples_source/zoo/zoo_images.md at 6be182e: (backbone, dataset) -> Recall@1
REFERENCE = {
    ("dinov2_vits14", "cub200"): 0.797,
    ("dinov2_vits14", "cars196"): 0.503,
    ("dinov2_vitb14", "cub200"): 0.842,
    ("dinov2_vitb14", "cars196"): 0.644,
}
TOLERANCE = 0.02  # absolute Recall@1
IMAGE_SIZE = CROP_SIZE = 224  # OML: Resize(224) + CenterCrop(224)
BACKBONES_CHECKED = ("dinov2_vits14", "dinov2_vitb14")
DATASETS_CHECKED = ("cub200", "cars196")


def dataset_params(name: str):
    """The dataset at a 224 px short side, the standard halves (the test half is what is ranked)."""
    return DATASETS[name].params.model_validate(
        {"source": {}, "image_size": IMAGE_SIZE, "max_aspect": 4 / 3, "split": {"scheme": "standard"}}
    )


def missing_inputs(dropbox: Path, fetch: bool = False) -> list[str]:
    """What the check lacks (archives not in ``dropbox``, weights not pinned and cached), one item
    each; ``fetch``: downloads them first where it can (CUB's archive, the Hub files)."""
    problems: list[str] = []
    for name in DATASETS_CHECKED:
        spec, params = DATASETS[name], dataset_params(name)
        if fetch:
            dropbox.mkdir(parents=True, exist_ok=True)
            for item in resolve(spec.archives, params.source):
                if item.urls and not (dropbox / item.filename).exists():
                    try:
                        ensure_archive(name, item, dropbox)
                    except DmlbenchError as exc:
                        problems.append(str(exc))
        problems += dataset_problems(spec, params, dropbox, lambda url: "not downloaded without --fetch")
    for backbone in BACKBONES_CHECKED:
        (file,) = BACKBONES[backbone].params().weights_files(backbone)
        if file.hub is not None and (problem := hub_file_problem(backbone, file.hub, fetch=fetch)):
            problems.append(problem)
    return problems


def recall_at_1(embeddings: np.ndarray, labels: np.ndarray, device: torch.device, metric: str) -> float:
    """Leave-one-out Recall@1 of ``embeddings`` queried against themselves (``euclidean`` or ``cosine``)."""
    x = torch.from_numpy(embeddings).to(device, torch.float32)
    if metric == "cosine":
        x = torch.nn.functional.normalize(x, dim=1)
    y = torch.from_numpy(labels).to(device)
    squared = (x * x).sum(1)
    hits = 0
    for start in range(0, len(x), 1024):
        block = x[start : start + 1024]
        if metric == "cosine":
            score = -(block @ x.T)
        else:
            score = squared[start : start + 1024, None] - 2 * block @ x.T + squared[None]
        rows = torch.arange(start, start + len(block), device=device)
        score[torch.arange(len(block), device=device), rows] = math.inf  # the query itself
        hits += int((y[score.argmin(1)] == y[rows]).sum())
    return hits / len(x)


def prepared(name: str, dropbox: Path, work: Path) -> PreparedDataset:
    """The dataset's cache under ``work`` (extracted and decoded once; reused by later runs)."""
    spec, params = DATASETS[name], dataset_params(name)
    out = work / "prepared" / name
    if not (out / "info.json").is_file():
        raw = work / "raw" / name
        spec.fetch(params, raw, dropbox)
        prepare_dataset(spec, params, raw, out)
    return PreparedDataset.load(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for dinov2_zoo_check.json")
    parser.add_argument("--fetch", action="store_true", help="download the weights and CUB's archive first")
    parser.add_argument("--data", type=Path, default=Path("data"), help="the archives' drop-box")
    parser.add_argument("--work", type=Path, default=Path("artifacts/zoo-check"), help="extracted and cached images")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args(argv)
    try:
        problems = missing_inputs(args.data, args.fetch)
    except DmlbenchError as exc:
        problems = [str(exc)]
    if problems:
        hint = "" if args.fetch else " (--fetch downloads the weights and CUB's archive where the internet is)"
        print(f"error: the DINOv2 zoo check needs {len(problems)} more input(s){hint}: " + " | ".join(problems),
              file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device(args.device)
    rows = []
    for dataset in DATASETS_CHECKED:
        test = prepared(dataset, args.data, args.work).split("test")
        for backbone in BACKBONES_CHECKED:
            started = time.perf_counter()
            model = build_model(backbone, BACKBONES[backbone].params(), 1, pooling="cls", pretrained=True)
            model = model.to(device).eval()
            features = compute_embeddings(model, test.images, IMAGE_SIZE, CROP_SIZE, args.batch_size, device,
                                          features=True, sizes=test.sizes, progress=True)  # fmt: skip
            euclidean = recall_at_1(features, test.labels, device, "euclidean")
            cosine = recall_at_1(features, test.labels, device, "cosine")
            reference = REFERENCE[(backbone, dataset)]
            rows.append({
                "backbone": backbone, "dataset": dataset, "queries": len(test), "recall_at_1_euclidean": euclidean,
                "recall_at_1_cosine": cosine, "oml_recall_at_1": reference, "difference": euclidean - reference,
                "within_tolerance": abs(euclidean - reference) <= TOLERANCE, "seconds": time.perf_counter() - started,
            })  # fmt: skip
            del model
    print(f"{'backbone':<15}{'dataset':<9}{'queries':>8}{'R@1 eucl':>10}{'R@1 cos':>9}{'OML':>7}{'diff':>8}  ok")
    for row in rows:
        print(f"{row['backbone']:<15}{row['dataset']:<9}{row['queries']:>8}{row['recall_at_1_euclidean']:>10.3f}"
              f"{row['recall_at_1_cosine']:>9.3f}{row['oml_recall_at_1']:>7.3f}{row['difference']:>+8.3f}  "
              f"{'yes' if row['within_tolerance'] else 'NO'}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "reference": "OML-Team/open-metric-learning 6be182e docs/readme/examples_source/zoo/zoo_images.md",
        "tolerance": TOLERANCE, "device": str(device), "torch": torch.__version__, "rows": rows,
    }  # fmt: skip
    (args.out / "dinov2_zoo_check.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(row["within_tolerance"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
