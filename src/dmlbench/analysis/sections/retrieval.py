"""Retrieval examples: test queries and their nearest test images per loss."""

from __future__ import annotations

from dmlbench import paths
from dmlbench.analysis.gallery import GalleryRun, retrieval_gallery
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.data.cache import PreparedDataset
from dmlbench.grid import Combo


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    config = params.report.gallery
    dataset, backbone = next(iter(params.datasets)), next(iter(params.backbones))
    ranked = [loss for loss in analysis.ranking["loss"]]
    chosen = ranked if len(ranked) <= config.max_losses else ranked[: config.max_losses - 1] + ranked[-1:]
    seed = params.seeds[0]
    runs = []
    for loss in chosen:
        run = Combo(dataset, backbone, loss, analysis.dim).with_seed(seed)
        fold = paths.folds_in(paths.embedding_dir(run))[0]  # cross-validation: the first fold model
        npz = paths.embedding_dir(run, fold) / "embeddings.npz"
        if not npz.exists():
            doc.note(f"No retrieval gallery: {npz} is missing (run train@{run.key}).")
            return
        runs.append(GalleryRun(f"{analysis.names[loss]} (rank {ranked.index(loss) + 1})", npz))
    prepared = PreparedDataset.load(paths.prepared_dir(dataset), in_memory=False)
    shown = "all losses" if len(chosen) == len(ranked) else f"the {len(chosen) - 1} best-ranked losses and the worst"
    doc.figure(
        "gallery",
        lambda p: retrieval_gallery(runs, prepared, p, config.queries, config.neighbours, config.seed),
        f"Retrieval on `{dataset}` with `{backbone}`, dim {analysis.dim}, seed {seed}, {shown}: each row is a test "
        f"query (left) and its {config.neighbours} nearest test images per loss, green = same class, red = another "
        "class.",
    )


SECTION = Section("Retrieval examples", "Retrieval examples", write)
